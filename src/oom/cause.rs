//! Why a GPU ran out of memory, decided from the numbers alone (pure): what the OOM text says, what NVML
//! saw, and which of the processes the text names belong to the job.

use super::parse::{Kind, OomText, TextProcess, Vendor};
use crate::units::fmt_bytes as b;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// Why the GPU ran out, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// One allocation larger than the GPU (or than what the process may use).
    TooBig,
    /// The process's own limit (`set_per_process_memory_fraction`), with the GPU itself not full.
    Cap,
    /// Other processes held memory that would have made the allocation fit.
    Others,
    /// PyTorch's cache held enough memory, but in pieces too small for the request.
    Fragmentation,
    /// The job itself grew to fill the GPU.
    SelfGrowth,
    /// Not enough numbers to say, or numbers that say the allocation should have fit.
    Unknown,
}

impl Cause {
    /// In words, for the summary.
    pub fn words(self) -> &'static str {
        match self {
            Cause::TooBig => "too big",
            Cause::Cap => "the process's memory cap",
            Cause::Others => "other processes",
            Cause::Fragmentation => "fragmentation",
            Cause::SelfGrowth => "the job's own growth",
            Cause::Unknown => "unknown",
        }
    }
}

/// Who the processes an OOM text names are: PyTorch names the failing process "this process"; inside a
/// container (where NVML's PIDs are the host's) it can't, and lists it as "Process N" like the others.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Holders {
    /// Memory of the named processes outside the job.
    pub others: u64,
    /// Memory of the job's own other processes the text names (a child it started, another rank).
    pub job: u64,
    /// The entry taken to be the failing process, when the text has no "this process" line.
    pub this_pid: Option<u32>,
    /// More than one entry could have been the failing process: the likeliest was taken.
    pub guessed: bool,
}

/// Sorts the text's "Process N" entries into the failing process, the job's others and everyone else.
/// The failing process, when not named, is the smallest entry that holds at least PyTorch's reserved
/// memory (its cache is part of its memory); with several such entries that is a guess.
pub fn holders(t: &OomText, job_pids: &HashSet<u32>) -> Holders {
    let named: &[TextProcess] = &t.other_processes;
    let mut h = Holders::default();
    if t.process_bytes.is_none() {
        let own = t.reserved_bytes.unwrap_or(u64::MAX);
        let covering: Vec<&TextProcess> = named.iter().filter(|p| p.bytes >= own).collect();
        if let Some(me) = covering.iter().min_by_key(|p| p.bytes) {
            h.this_pid = Some(me.pid);
            h.guessed = covering.len() > 1;
        }
    }
    for p in named.iter().filter(|p| Some(p.pid) != h.this_pid) {
        if job_pids.contains(&p.pid) {
            h.job += p.bytes;
        } else {
            h.others += p.bytes;
        }
    }
    h
}

/// The numbers a cause is decided from; `None` where nobody said.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    pub requested: Option<u64>,
    /// The GPU's capacity (the text's, else NVML's).
    pub total: Option<u64>,
    pub free: Option<u64>,
    /// The process's cap, `X allowed`.
    pub allowed: Option<u64>,
    /// What sets that cap, in words (for the explanation).
    pub allowed_by: &'static str,
    /// What the failing process held, non-PyTorch memory included (`this process has X`, or its entry).
    pub process: Option<u64>,
    pub allocated: Option<u64>,
    pub reserved: Option<u64>,
    pub unallocated: Option<u64>,
    /// Other processes' memory on that GPU (the text's, or NVML's: the larger).
    pub others: u64,
    /// The job's other processes' memory the text names.
    pub job_others: u64,
    /// NVML's device memory in use then.
    pub device_used: Option<u64>,
    /// An AMD GPU: NVML cannot see it, so memory outside the process is nobody gpudoc can name.
    pub vendor: Vendor,
    /// vLLM's account of its KV cache, when the text is vLLM's.
    pub kv_cache: Option<KvCache>,
}

/// What vLLM says of its KV cache when it has no room for it; `None` where it says nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvCache {
    /// `max_model_len`: one request of it must fit.
    pub max_model_len: Option<u64>,
    /// The tokens the cache could hold.
    pub tokens: Option<u64>,
    /// The KV cache one request of `max_model_len` needs, and what vLLM's share of the GPU left for it.
    pub needed: Option<u64>,
    pub left: Option<u64>,
}

impl Figures {
    /// The figures of a text, with who holds what and NVML's view.
    pub fn of(
        t: &OomText,
        h: &Holders,
        nvml_others: u64,
        total: Option<u64>,
        used: Option<u64>,
    ) -> Figures {
        let this_entry = h
            .this_pid
            .and_then(|pid| t.other_processes.iter().find(|p| p.pid == pid))
            .map(|p| p.bytes);
        Figures {
            requested: t.requested_bytes,
            total: t.total_bytes.or(total),
            free: t.free_bytes,
            allowed: t.allowed_bytes,
            allowed_by: match t.kind {
                Kind::Cupy => {
                    "CuPy's memory pool limit: MemoryPool.set_limit or CUPY_GPU_MEMORY_LIMIT"
                }
                _ => "torch.cuda.set_per_process_memory_fraction",
            },
            // PyTorch prints "this process has 0 bytes" when NVML can't see it (a container): unknown.
            process: t.process_bytes.filter(|&b| b > 0).or(this_entry),
            allocated: t.allocated_bytes,
            reserved: t.reserved_bytes,
            unallocated: t.reserved_unallocated_bytes,
            others: h.others.max(nvml_others),
            job_others: h.job,
            device_used: used,
            vendor: t.vendor,
            kv_cache: (t.kind == Kind::Vllm).then_some(KvCache {
                max_model_len: t.max_model_len,
                tokens: t.kv_cache_tokens,
                needed: t.requested_bytes,
                left: t.free_bytes,
            }),
        }
    }

    /// What the failing process held: its whole memory, else its PyTorch cache.
    fn held(&self) -> Option<u64> {
        self.process.or(self.reserved)
    }
}

/// A request counts as fitting in what was free only with room to spare: CUDA maps memory in pages and
/// needs it in one piece.
fn clearly_fits(req: u64, free: u64) -> bool {
    free >= req + req / 20 + (64 << 20)
}

type Verdict = Option<(Cause, String)>;

/// The cause and the same in words with its numbers.
pub fn cause_of(f: &Figures) -> (Cause, String) {
    let steps: [fn(&Figures) -> Verdict; 9] = [
        kv_cache,
        too_big,
        capped,
        fits,
        others,
        fragmented,
        outside,
        self_growth,
        nvml_only,
    ];
    steps.iter().find_map(|s| s(f)).unwrap_or((
        Cause::Unknown,
        "the output does not carry the allocator's numbers".into(),
    ))
}

/// vLLM's engine had no room for its KV cache in the share of the GPU `gpu_memory_utilization` gives it:
/// the model's weights and its activation peak took the rest. That share is its cap, unless other
/// processes held memory, which vLLM counts against it.
fn kv_cache(f: &Figures) -> Verdict {
    let kv = f.kv_cache.as_ref()?;
    let short = match (kv.max_model_len, kv.tokens, kv.needed, kv.left) {
        (Some(len), Some(tokens), ..) => format!(
            "vLLM's KV cache holds {tokens} tokens, fewer than one request of max_model_len ({len} tokens) needs"
        ),
        (Some(len), _, Some(needed), Some(left)) => format!(
            "one request of max_model_len ({len} tokens) needs {} of KV cache, more than the {} vLLM had left for it",
            b(needed),
            b(left)
        ),
        _ => "vLLM had no room left for its KV cache".into(),
    };
    if f.others > 0 {
        return Some((
            Cause::Others,
            format!(
                "{short}: other processes held {} of the GPU, which vLLM counts against its share (gpu_memory_utilization)",
                b(f.others)
            ),
        ));
    }
    let of = f.total.map(|t| format!(" ({})", b(t))).unwrap_or_default();
    Some((
        Cause::Cap,
        format!(
            "{short} in the share of the GPU{of} it may use (gpu_memory_utilization): the model's weights and its activation peak took the rest"
        ),
    ))
}

fn too_big(f: &Figures) -> Verdict {
    let req = f.requested?;
    let (limit, what) = match (f.allowed, f.total) {
        (Some(a), _) if req > a => (a, "the memory this process may use"),
        (_, Some(t)) if req > t => (t, "the whole GPU"),
        _ => return None,
    };
    Some((
        Cause::TooBig,
        format!(
            "one allocation of {} is larger than {what} ({})",
            b(req),
            b(limit)
        ),
    ))
}

/// The process's cap, when it alone stopped the allocation: the GPU itself had room for it. A text that
/// gives no free memory (CuPy's pool checks its limit before it asks the device) needs none.
fn capped(f: &Figures) -> Verdict {
    let (req, allowed) = (f.requested?, f.allowed?);
    let held = f.reserved.or(f.process).unwrap_or(0);
    if held + req <= allowed || f.free.is_some_and(|free| !clearly_fits(req, free)) {
        return None;
    }
    let free = f
        .free
        .map(|free| format!("; the GPU had {} free", b(free)))
        .unwrap_or_default();
    Some((
        Cause::Cap,
        format!(
            "the process may use only {} of the GPU ({}) and already held {} when it asked for {} more{free}",
            b(allowed),
            f.allowed_by,
            b(held),
            b(req)
        ),
    ))
}

fn fits(f: &Figures) -> Verdict {
    let (req, free) = (f.requested?, f.free?);
    clearly_fits(req, free).then(|| {
        (
            Cause::Unknown,
            format!(
                "the GPU had {} free, more than the {} asked for: what kept it from fitting is not in the numbers (no free block that large, a limit the text does not show)",
                b(free),
                b(req)
            ),
        )
    })
}

fn others(f: &Figures) -> Verdict {
    let (req, free) = (f.requested?, f.free?);
    (f.others > 0 && free + f.others >= req).then(|| {
        (
            Cause::Others,
            format!(
                "other processes held {} of the GPU; with it free, the {} asked for would have fit ({} was free)",
                b(f.others),
                b(req),
                b(free)
            ),
        )
    })
}

/// The share of its cache PyTorch must hold unallocated for fragmentation to be the cause: below it, the
/// GPU is full of live tensors and reclaiming the pieces would buy an allocation or two (the real texts
/// with a few MiB free in the cache of a full GPU hold 0.15-0.8% of it, the fragmented ones 5.6-85%).
const FRAGMENTED_SHARE_PCT: u64 = 2;

fn fragmented(f: &Figures) -> Verdict {
    let (req, unalloc) = (f.requested?, f.unallocated?);
    let worth = f
        .reserved
        .is_none_or(|r| unalloc.saturating_mul(100) >= r.saturating_mul(FRAGMENTED_SHARE_PCT));
    (unalloc >= req && worth).then(|| {
        (
            Cause::Fragmentation,
            format!(
                "PyTorch held {} reserved but unallocated, more than the {} asked for, in pieces too small to use",
                b(unalloc),
                b(req)
            ),
        )
    })
}

/// Memory in use that neither the failing process nor the job's others account for: other processes the
/// text could not name (older PyTorch names none).
fn outside(f: &Figures) -> Verdict {
    let (req, free, total, held) = (f.requested?, f.free?, f.total?, f.held()?);
    let outside = total.saturating_sub(free + held + f.job_others);
    if !(outside > held && outside + free >= req) {
        return None;
    }
    if f.vendor == Vendor::Amd {
        // NVML cannot see the GPU, and on an APU the GPU's memory is the system's RAM: nobody to name.
        return Some((
            Cause::Unknown,
            format!(
                "{} of the GPU was in use outside this process while it held {}; with that free, the {} asked for would have fit. On an AMD GPU NVML cannot show who held it: other processes, or on an APU (memory shared with the system) the system's own use of its RAM",
                b(outside),
                b(held),
                b(req)
            ),
        ));
    }
    Some((
        Cause::Others,
        format!(
            "{} of the GPU was in use outside this process (other processes, or its own memory outside PyTorch), while it held {}; with that free, the {} asked for would have fit",
            b(outside),
            b(held),
            b(req)
        ),
    ))
}

fn self_growth(f: &Figures) -> Verdict {
    let req = f.requested?;
    f.allocated?;
    let held = f.held().filter(|&h| h > 0)?;
    let job = if f.job_others > 0 {
        format!(" (and its other processes {})", b(f.job_others))
    } else {
        String::new()
    };
    Some((
        Cause::SelfGrowth,
        format!(
            "the job itself held {}{job} when it asked for {} more",
            b(held),
            b(req)
        ),
    ))
}

/// Without the allocator's numbers, NVML's view decides between others and the job.
fn nvml_only(f: &Figures) -> Verdict {
    let (total, used) = (f.total?, f.device_used?);
    if f.others * 2 > total {
        return Some((
            Cause::Others,
            format!(
                "other processes held {} of the GPU's {}",
                b(f.others),
                b(total)
            ),
        ));
    }
    (used * 10 > total * 9).then(|| {
        (
            Cause::SelfGrowth,
            format!(
                "the GPU was {} full, mostly by the job",
                crate::units::fmt_pct(used, total)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_cap_is_named_when_the_gpu_had_room() {
        let f = Figures {
            requested: Some(2 * GIB),
            total: Some(140 * GIB),
            free: Some(115 * GIB),
            allowed: Some(35 * GIB),
            reserved: Some(34 * GIB),
            allocated: Some(34 * GIB),
            ..Default::default()
        };
        let (c, why) = cause_of(&f);
        assert_eq!(c, Cause::Cap, "{why}");
        assert!(
            why.contains("35.00 GiB") && why.contains("115.00 GiB free"),
            "{why}"
        );
    }

    #[test]
    fn a_pool_limit_checked_before_the_device_is_a_cap_without_free_memory() {
        // CuPy: `Out of memory allocating 1 GiB (allocated so far: 3 GiB, limit set to: 3.5 GiB)`.
        let f = Figures {
            requested: Some(GIB),
            allowed: Some(7 * GIB / 2),
            reserved: Some(3 * GIB),
            allowed_by: "CuPy's memory pool limit",
            ..Default::default()
        };
        let (c, why) = cause_of(&f);
        assert_eq!(c, Cause::Cap, "{why}");
        assert!(
            why.contains("CuPy's memory pool limit") && !why.contains("free"),
            "{why}"
        );
        // Within the limit, the limit explains nothing.
        let within = Figures {
            reserved: Some(GIB),
            ..f
        };
        assert_ne!(cause_of(&within).0, Cause::Cap);
    }

    #[test]
    fn enough_free_is_not_the_jobs_growth() {
        let f = Figures {
            requested: Some(2 * GIB),
            total: Some(4 * GIB),
            free: Some(2 * GIB + 800 * (1 << 20)),
            allocated: Some(0),
            reserved: Some(0),
            ..Default::default()
        };
        assert_eq!(cause_of(&f).0, Cause::Unknown);
    }

    #[test]
    fn the_jobs_own_child_named_by_the_text_is_the_jobs() {
        let t = crate::oom::parse::parse_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 9.29 GiB is free. Process 4242 has 110.51 GiB memory in use. Including non-PyTorch memory, this process has 20.00 GiB memory in use. Of the allocated memory 19.00 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.").unwrap();
        let job: HashSet<u32> = [4242].into();
        let h = holders(&t, &job);
        assert_eq!((h.others, h.job), (0, t.other_processes[0].bytes));
        let (c, why) = cause_of(&Figures::of(&t, &h, 0, None, None));
        assert_eq!(c, Cause::SelfGrowth, "{why}");
        assert!(why.contains("its other processes 110.51 GiB"), "{why}");
        let h = holders(&t, &HashSet::new());
        assert_eq!(
            cause_of(&Figures::of(&t, &h, 0, None, None)).0,
            Cause::Others
        );
    }

    #[test]
    fn unknown_numbers_are_never_zero() {
        let f = Figures {
            total: Some(140 * GIB),
            device_used: Some(139 * GIB),
            others: 110 * GIB,
            ..Default::default()
        };
        let (c, why) = cause_of(&f);
        assert_eq!(c, Cause::Others);
        assert!(!why.contains("0 B"), "{why}");
    }
}
