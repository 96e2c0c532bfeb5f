//! What some rows of the formats table add beyond their patterns' figures (their [`Then`](super::wording::Then)): a device
//! printed as a character, a sum of two figures, figures that share one unit, a size from a tensor's
//! shape.

use super::text::{Opened, size_bytes};
use super::wording::Found;

/// PyTorch printed the cudaMallocAsync allocator's device number as a character: its code is the
/// number.
pub(super) fn device_as_character(o: &mut Opened, found: &Found, _: &str) -> Option<()> {
    o.text.gpu = found.group("device").and_then(|d| match d.parse() {
        Ok(n) => Some(n),
        Err(_) => d.chars().next().map(|ch| ch as u32),
    });
    Some(())
}

/// ggml's first line gives MiB with two decimals: the exact size on the next makes it complete.
pub(super) fn exact_size_follows(o: &mut Opened, _: &Found, _: &str) -> Option<()> {
    o.text.complete = false;
    Some(())
}

/// "MPS allocated" is what the allocator's heaps hold; "other allocations" the process's other Metal
/// memory; the watermark bounds their sum.
pub(super) fn metal_memory(o: &mut Opened, found: &Found, _: &str) -> Option<()> {
    let t = &mut o.text;
    t.process_bytes = t
        .reserved_bytes
        .zip(found.figure("other"))
        .map(|(a, b)| a + b);
    t.complete =
        t.process_bytes.is_some() && t.allowed_bytes.is_some() && t.requested_bytes.is_some();
    Some(())
}

/// vLLM writes free and total memory with one unit: `(7.34/139.72 GiB)`.
pub(super) fn free_of_total(o: &mut Opened, found: &Found, _: &str) -> Option<()> {
    let unit = found.group("unit")?;
    o.text.free_bytes = size_bytes(found.group("free")?, unit);
    o.text.total_bytes = size_bytes(found.group("total")?, unit);
    Some(())
}

/// The library's name is the format (`cublas`, `cudnn`).
pub(super) fn library_name(o: &mut Opened, found: &Found, _: &str) -> Option<()> {
    o.text.format = found.group("library")?.to_ascii_lowercase();
    Some(())
}

/// TensorFlow's tensor: its size from its shape and type; on the CPU (`device:CPU:0`, `allocator cpu`)
/// it is host memory.
pub(super) fn tensor_size(o: &mut Opened, found: &Found, _: &str) -> Option<()> {
    let on = found.group("on").unwrap_or("");
    let allocator = found.group("allocator").unwrap_or("");
    if on.contains("device:CPU:") || ["cpu", "mklcpu"].contains(&allocator) {
        return None;
    }
    let shape = found.group("dims").unwrap_or("").trim();
    let dims: Option<Vec<u64>> = shape.split(',').map(|d| d.trim().parse().ok()).collect();
    let dtype = found.group("dtype");
    let t = &mut o.text;
    t.requested_bytes = dims
        .zip(dtype.and_then(dtype_bytes))
        .and_then(|(d, e)| d.iter().try_fold(e, |acc, &x| acc.checked_mul(x)));
    t.tensor = Some(match dtype {
        Some(d) => format!("{d}[{shape}]"),
        None => format!("[{shape}]"),
    });
    t.complete = t.requested_bytes.is_some() && t.gpu.is_some();
    Some(())
}

fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "float" | "float32" | "int32" | "uint32" => 4,
        "double" | "float64" | "int64" | "uint64" | "complex64" => 8,
        "half" | "float16" | "bfloat16" | "int16" | "uint16" => 2,
        "int8" | "uint8" | "bool" | "qint8" | "quint8" => 1,
        "complex128" => 16,
        _ => return None,
    })
}
