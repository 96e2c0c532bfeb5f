//! An OOM's finding in words, with its numbers: the explanation the summary prints after its cause and
//! the OOM rules' messages quote (`oom.explanation`). The deciding is `cause::cause_of`'s; this only words
//! what it found, so each sentence here has one finding behind it.

use super::cause::{Figures, Finding, KvShort, Whose};
use crate::units::fmt_bytes as b;

/// `finding` in words, with the figures it was found in.
pub fn words(finding: &Finding, f: &Figures) -> String {
    match *finding {
        Finding::KvStartup { wanted, free, .. } => kv_startup(f, wanted, free),
        Finding::KvShort { short, .. } => kv_short(f, short),
        Finding::Garbled => "one allocation of more than 1 EiB is larger than any GPU: its size was computed wrong (a negative or garbled number)".into(),
        Finding::TooBig {
            requested,
            limit,
            of_cap,
        } => {
            let what = if of_cap {
                "the memory this process may use".to_string()
            } else {
                format!("the whole {}", f.vendor.chip())
            };
            format!(
                "one allocation of {} is larger than {what} ({})",
                b(requested),
                b(limit)
            )
        }
        Finding::Capped {
            allowed,
            held,
            requested,
            asked,
            free,
        } => capped(f, allowed, held, requested, asked, free),
        Finding::Fits { requested, free } => format!(
            "the GPU had {} free, more than the {} asked for: what kept it from fitting is not in the numbers (no free block that large, a limit the text does not show)",
            b(free),
            b(requested)
        ),
        Finding::Others { requested, free } => format!(
            "other processes held {} of the GPU; with it free, the {} asked for would have fit ({} was free)",
            b(f.others),
            b(requested),
            b(free)
        ),
        Finding::Fragmented {
            requested,
            unallocated,
        } => format!(
            "PyTorch held {} reserved but unallocated, more than the {} asked for, in pieces too small to use",
            b(unallocated),
            b(requested)
        ),
        Finding::Outside {
            requested,
            outside,
            held,
            whose,
        } => outside_words(f, (requested, outside, held), whose),
        Finding::SelfGrowth { requested, held } => {
            let job = if f.job_others > 0 {
                format!(" (and its other processes {})", b(f.job_others))
            } else {
                String::new()
            };
            format!(
                "the job itself held {}{job} when it asked for {} more",
                b(held),
                b(requested)
            )
        }
        Finding::NvmlOthers { total } => format!(
            "other processes held {} of the GPU's {}",
            b(f.others),
            b(total)
        ),
        Finding::NvmlFull { used, total } => format!(
            "the GPU was {} full, mostly by the job",
            crate::units::fmt_pct(used, total)
        ),
        Finding::ShortOfFree { requested, free } => {
            let of = f.total.map(|t| format!(" of {}", b(t))).unwrap_or_default();
            format!(
                "asked for {} with {}{of} free: the text does not say what held the rest of the {}",
                b(requested),
                b(free),
                f.vendor.chip()
            )
        }
        Finding::NoNumbers => "the output does not carry the allocator's numbers".into(),
    }
}

/// vLLM refused to start: less of the GPU was free than its share asks for, before it loaded anything.
fn kv_startup(f: &Figures, wanted: u64, free: u64) -> String {
    let (engine, share) = f
        .kv_cache
        .as_ref()
        .map_or(("", ""), |k| (k.engine, k.share));
    let of = f.total.map(|t| format!(" of {}", b(t))).unwrap_or_default();
    let short = format!(
        "{engine}'s share of the GPU ({share}) is {}, more than the {}{of} free when it started",
        b(wanted),
        b(free)
    );
    if f.others > 0 {
        return format!("{short}: other processes held {}", b(f.others));
    }
    format!("{short}: the rest was in use before it loaded anything, by whom the text does not say")
}

/// A serving engine's KV cache without room in its share, and who took the rest.
fn kv_short(f: &Figures, short: KvShort) -> String {
    let (engine, share) = f
        .kv_cache
        .as_ref()
        .map_or(("", ""), |k| (k.engine, k.share));
    let short = match short {
        KvShort::Tokens { len, tokens } => format!(
            "vLLM's KV cache holds {tokens} tokens, fewer than one request of max_model_len ({len} tokens) needs"
        ),
        KvShort::Bytes { len, needed, left } => format!(
            "one request of max_model_len ({len} tokens) needs {} of KV cache, more than the {} vLLM had left for it",
            b(needed),
            b(left)
        ),
        KvShort::NoRoom => format!("{engine} had no room left for its KV cache"),
    };
    if f.others > 0 {
        return format!(
            "{short}: other processes held {} of the GPU, which {engine} counts against its share ({share})",
            b(f.others)
        );
    }
    let of = f.total.map(|t| format!(" ({})", b(t))).unwrap_or_default();
    format!(
        "{short} in the share of the GPU{of} it may use ({share}): the model's weights and its activation peak took the rest"
    )
}

fn capped(
    f: &Figures,
    allowed: u64,
    held: u64,
    requested: u64,
    asked: u64,
    free: Option<u64>,
) -> String {
    let segment = if asked > requested {
        format!(
            " (PyTorch asks the device for a {} segment to hold it)",
            b(asked)
        )
    } else {
        String::new()
    };
    let free = free
        .map(|free| format!("; the GPU had {} free", b(free)))
        .unwrap_or_default();
    format!(
        "the process may use only {} of the GPU ({}) and already held {} when it asked for {} more{segment}{free}",
        b(allowed),
        f.allowed_by,
        b(held),
        b(requested)
    )
}

fn outside_words(f: &Figures, (requested, outside, held): (u64, u64, u64), whose: Whose) -> String {
    match whose {
        Whose::OthersOrAsyncPool => format!(
            "{} of the GPU was in use outside PyTorch's live tensors while they held {}; with that free, the {} asked for would have fit. It is other processes' memory, or memory PyTorch freed that cudaMallocAsync's pool kept: the text does not tell them apart",
            b(outside),
            b(held),
            b(requested)
        ),
        Whose::Unseen => format!(
            "{} of the GPU was in use outside this process while it held {}; with that free, the {} asked for would have fit. On an {} GPU NVML cannot show who held it: other processes, or where the GPU shares the system's memory (an APU, an integrated GPU) the system's own use of its RAM",
            b(outside),
            b(held),
            b(requested),
            f.vendor.names().0
        ),
        Whose::Others => format!(
            "{} of the GPU was in use outside this process (other processes, or its own memory outside PyTorch), while it held {}; with that free, the {} asked for would have fit",
            b(outside),
            b(held),
            b(requested)
        ),
    }
}
