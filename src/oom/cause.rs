//! Why a GPU ran out of memory, decided from the numbers alone (pure): what the OOM text says, what NVML
//! saw, and which of the processes the text names belong to the job. What it finds is data
//! ([`Finding`], kept in the report as a [`Found`] with the figures its words cite); the words are the
//! rules' (`rules/words/oom-cause.toml`, read by `rules::words`).

use super::formats::{self, Allocator};
use super::parse::{Kind, OomText, TextProcess, Vendor};
use crate::params;
use crate::torch::framework::Framework;
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
    /// The cap bounds the whole process's memory, not the allocator's cache alone (MPS's watermark).
    pub cap_counts_process: bool,
    /// What the allocator asks the device for to serve the request, where that is larger (PyTorch's
    /// caching allocator serves a small request from a whole segment): a cap is checked against it.
    pub segment: Option<u64>,
    /// How far the text's rounded figures may fall short of the true sums (PyTorch prints two decimals).
    pub slack: u64,
    /// PyTorch's cudaMallocAsync allocator: memory it freed stays in CUDA's pool, outside its figures.
    pub async_pool: bool,
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
    /// Not NVIDIA's: NVML cannot see it, so memory outside the process is nobody gpudoc can name.
    pub vendor: Vendor,
    /// vLLM's account of its KV cache, when the text is vLLM's.
    pub kv_cache: Option<KvCache>,
}

/// What a serving engine (vLLM, SGLang) says of its KV cache when it has no room for it; `None` where it
/// says nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvCache {
    /// The engine, and the setting that gives it its share of the GPU.
    pub engine: &'static str,
    pub share: &'static str,
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
            allowed_by: cap_setting(t),
            cap_counts_process: allocator(t) == Allocator::Watermark,
            segment: t
                .requested_bytes
                .filter(|_| caching_segments(t))
                .map(torch_segment),
            slack: if t.kind == Kind::TorchAllocator {
                t.allowed_bytes.map_or(0, |a| 3 * half_printed_unit(a))
            } else {
                0
            },
            async_pool: allocator(t) == Allocator::Async,
            // PyTorch prints "this process has 0 bytes" when NVML can't see it (a container): unknown.
            process: t.process_bytes.filter(|&b| b > 0).or(this_entry),
            allocated: t.allocated_bytes,
            reserved: t.reserved_bytes,
            unallocated: t.reserved_unallocated_bytes,
            others: h.others.max(nvml_others),
            job_others: h.job,
            device_used: used,
            vendor: t.vendor,
            kv_cache: kv_engine(t.kind).map(|(engine, share)| KvCache {
                engine,
                share,
                max_model_len: t.max_model_len,
                tokens: t.kv_cache_tokens,
                needed: t.requested_bytes,
                left: t.free_bytes,
            }),
        }
    }

    /// What the failing process held: its whole memory, else its PyTorch cache, else its live tensors
    /// (the cudaMallocAsync allocator's only figure).
    fn held(&self) -> Option<u64> {
        self.process.or(self.reserved).or(self.allocated)
    }
}

/// The serving engines that size a KV cache in a share of the GPU: their names and that share's setting.
fn kv_engine(kind: Kind) -> Option<(&'static str, &'static str)> {
    match kind {
        Kind::Vllm => Some(("vLLM", "gpu_memory_utilization")),
        Kind::Sglang => Some(("SGLang", "--mem-fraction-static")),
        _ => None,
    }
}

/// What sets a text's cap, in words: its framework's setting, PyTorch's by the backend it runs on.
fn cap_setting(t: &OomText) -> &'static str {
    let framework = match t.kind {
        Kind::Cupy => Framework::Cupy,
        Kind::Tensorflow => Framework::Tensorflow,
        Kind::Xla => Framework::Jax,
        _ => Framework::Torch,
    };
    cap_setting_of(framework, t.vendor, allocator(t) == Allocator::Watermark)
}

/// What sets the limit of a framework's allocator (the cap an OOM ran into), in words: the one owner of
/// these words, which an OOM's finding carries to `rules/words/oom-cause.toml` (`finding.cap_setting`).
/// PyTorch's by its backend: MPS's watermark (`watermark`) bounds the process's whole Metal memory, XPU
/// and CUDA have a fraction of the device.
pub fn cap_setting_of(framework: Framework, vendor: Vendor, watermark: bool) -> &'static str {
    match framework {
        Framework::Torch if watermark => {
            "PYTORCH_MPS_HIGH_WATERMARK_RATIO, the share of the system's memory MPS may use"
        }
        Framework::Torch if vendor == Vendor::Intel => "torch.xpu.set_per_process_memory_fraction",
        Framework::Torch => "torch.cuda.set_per_process_memory_fraction",
        Framework::Jax => {
            "XLA_PYTHON_CLIENT_MEM_FRACTION, the share of the GPU XLA's allocator may use (.75 by default)"
        }
        Framework::Cupy => {
            "CuPy's memory pool limit: MemoryPool.set_limit or CUPY_GPU_MEMORY_LIMIT"
        }
        Framework::Tensorflow => {
            "the memory limit of TensorFlow's BFC allocator (all of the GPU's free memory at its start, or tf.config.set_logical_device_configuration's memory_limit)"
        }
        Framework::Rmm => {
            "the size of RMM's pool (rmm.reinitialize(pool_allocator=True, initial_pool_size=..., maximum_pool_size=...))"
        }
    }
}

/// Whether the text is PyTorch's caching allocator's (CUDA, ROCm), which serves requests from segments.
fn caching_segments(t: &OomText) -> bool {
    allocator(t) == Allocator::Caching
}

/// How the allocator that wrote the text holds memory, as its row in the formats table says.
fn allocator(t: &OomText) -> Allocator {
    formats::row_of(t).map_or(Allocator::Other, |f| f.allocator)
}

const MIB: u64 = 1 << 20;

/// The segment PyTorch's caching allocator asks the device for to serve `req` bytes
/// (CUDACachingAllocator's get_allocation_size): up to 1 MiB from a 2 MiB segment, under 10 MiB from a
/// 20 MiB one, larger requests rounded up to 2 MiB.
fn torch_segment(req: u64) -> u64 {
    match req {
        r if r <= MIB => 2 * MIB,
        r if r < 10 * MIB => 20 * MIB,
        r => r.div_ceil(2 * MIB) * 2 * MIB,
    }
}

/// Half the last printed digit of a figure PyTorch wrote with two decimals in the unit it chose for it
/// (the largest of B, KiB, MiB, GiB, TiB below it): how far the printed figure may be from the true one.
fn half_printed_unit(bytes: u64) -> u64 {
    let mut unit: u64 = 1;
    while unit < 1 << 40 && bytes >= unit << 10 {
        unit <<= 10;
    }
    unit / 200
}

/// A request counts as fitting in what was free only with room to spare: CUDA maps memory in pages and
/// needs it in one piece (`oom_fits_margin_pct`, `oom_fits_slack_bytes`).
fn clearly_fits(req: u64, free: u64) -> bool {
    let margin = share(req, params::OOM_FITS_MARGIN.uint());
    free as u128 >= req as u128 + margin as u128 + params::OOM_FITS_SLACK.uint() as u128
}

/// `pct` percent of `bytes`, rounded down, without overflow.
fn share(bytes: u64, pct: u64) -> u64 {
    (bytes as u128 * pct as u128 / 100) as u64
}

/// What an OOM's numbers show, decided from them alone: the kind of finding and the figures behind it,
/// no words ([`Finding::cause`] is its cause; `rules/words/oom-cause.toml` words it, as `finding.kind`
/// and its figures, in bytes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// A serving engine refused to start: its share of the GPU (`wanted`) was more than was `free`;
    /// `by_others`: other processes held memory then.
    KvStartup {
        wanted: u64,
        free: u64,
        by_others: bool,
    },
    /// A serving engine had no room for its KV cache in its share (`short` says how); `by_others`: other
    /// processes held memory, which the engines count against the share.
    KvShort {
        #[serde(flatten)]
        short: KvShort,
        by_others: bool,
    },
    /// One allocation of more than 1 EiB: its size was computed wrong.
    Garbled,
    /// One allocation larger than the process's cap (`of_cap`) or than the whole device (`limit`).
    TooBig {
        requested: u64,
        limit: u64,
        of_cap: bool,
    },
    /// The process's cap alone stopped it: it `held` that much, and asked the device for `asked` (the
    /// segment PyTorch's caching allocator asks for, where larger than the request).
    Capped {
        allowed: u64,
        held: u64,
        requested: u64,
        asked: u64,
        free: Option<u64>,
    },
    /// More was free than was asked for, with room to spare: the numbers do not explain it.
    Fits { requested: u64, free: u64 },
    /// With other processes' memory free, the request would have fit.
    Others { requested: u64, free: u64 },
    /// PyTorch held more reserved but unallocated than the request, in pieces too small.
    Fragmented { requested: u64, unallocated: u64 },
    /// Memory in use outside the failing process and the job's others that would have made it fit, and
    /// whose it can be.
    Outside {
        requested: u64,
        outside: u64,
        held: u64,
        whose: Whose,
    },
    /// The job itself held what filled the GPU.
    SelfGrowth { requested: u64, held: u64 },
    /// Without the allocator's numbers: NVML saw other processes hold more than `oom_others_share_pct`.
    NvmlOthers { total: u64 },
    /// Without the allocator's numbers: NVML saw the GPU more than `oom_full_pct` full.
    NvmlFull { used: u64, total: u64 },
    /// Asked for more than was free, with nothing of who held the rest.
    ShortOfFree { requested: u64, free: u64 },
    /// The text carries none of the numbers.
    NoNumbers,
}

/// How a serving engine's KV cache fell short (`finding.short`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "short", rename_all = "snake_case")]
pub enum KvShort {
    /// The cache holds fewer tokens than one request of `max_model_len`.
    Tokens { len: u64, tokens: u64 },
    /// One request of `max_model_len` needs more than the share left for the cache.
    Bytes { len: u64, needed: u64, left: u64 },
    /// No room, with no figures.
    NoRoom,
}

/// Whose memory outside the failing process can be (`finding.whose`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Whose {
    /// Other processes', or memory PyTorch freed that cudaMallocAsync's pool kept: the text does not tell.
    OthersOrAsyncPool,
    /// On a GPU NVML cannot see: other processes', or the system's where the GPU shares its memory.
    Unseen,
    /// Other processes', or the process's own memory outside PyTorch.
    Others,
}

impl Finding {
    /// Its cause, in one word.
    pub fn cause(self) -> Cause {
        match self {
            Finding::KvStartup { by_others, .. } | Finding::KvShort { by_others, .. } => {
                if by_others {
                    Cause::Others
                } else {
                    Cause::Cap
                }
            }
            Finding::Garbled | Finding::TooBig { .. } => Cause::TooBig,
            Finding::Capped { .. } => Cause::Cap,
            Finding::Others { .. }
            | Finding::NvmlOthers { .. }
            | Finding::Outside {
                whose: Whose::Others,
                ..
            } => Cause::Others,
            Finding::Fragmented { .. } => Cause::Fragmentation,
            Finding::SelfGrowth { .. } | Finding::NvmlFull { .. } => Cause::SelfGrowth,
            Finding::Fits { .. }
            | Finding::Outside { .. }
            | Finding::ShortOfFree { .. }
            | Finding::NoNumbers => Cause::Unknown,
        }
    }
}

/// What the numbers show: the first of the steps, in order, that finds something.
pub fn cause_of(f: &Figures) -> Finding {
    let steps: [fn(&Figures) -> Option<Finding>; 10] = [
        kv_cache,
        too_big,
        capped,
        fits,
        others,
        fragmented,
        outside,
        self_growth,
        nvml_only,
        short_of_free,
    ];
    steps
        .iter()
        .find_map(|s| s(f))
        .unwrap_or(Finding::NoNumbers)
}

/// An OOM's finding as the report keeps it (`oom.finding`) and its words read it (`finding.*`): the
/// finding's kind and figures, and beside them the figures and names of the OOM its words cite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Found {
    #[serde(flatten)]
    pub finding: Finding,
    /// Other processes' memory on that GPU (the text's, or NVML's: the larger).
    pub others_bytes: u64,
    /// The job's other processes' memory the text names.
    pub job_others_bytes: u64,
    /// The GPU's capacity (the text's, else NVML's), null if unknown.
    pub capacity: Option<u64>,
    /// What the device is: `GPU`, or `TPU`.
    pub chip: String,
    /// Its vendor's name: `NVIDIA`, `AMD`, `Intel`, `Apple`, `Google`.
    pub vendor: String,
    /// What sets the process's cap (`torch.cuda.set_per_process_memory_fraction`), empty where none.
    pub cap_setting: String,
    /// A serving engine that sizes a KV cache in a share of the GPU (`vLLM`, `SGLang`) and that share's
    /// setting, empty for others.
    pub engine: String,
    pub share: String,
    /// The "Process N" entry taken to be the failing process where the text names no "this process" and
    /// more than one entry could have been it (a guess); null otherwise.
    pub guessed_pid: Option<u32>,
}

impl Found {
    /// `finding`, with the figures and names its words cite from `f` and the text's holders `h`.
    pub fn of(finding: Finding, f: &Figures, h: &Holders) -> Found {
        let kv = f.kv_cache.as_ref();
        Found {
            finding,
            others_bytes: f.others,
            job_others_bytes: f.job_others,
            capacity: f.total,
            chip: f.vendor.chip().into(),
            vendor: f.vendor.names().0.into(),
            cap_setting: f.allowed_by.into(),
            engine: kv.map_or("", |k| k.engine).into(),
            share: kv.map_or("", |k| k.share).into(),
            guessed_pid: h.this_pid.filter(|_| h.guessed),
        }
    }
}

impl Found {
    /// One finding of every kind (each way a KV cache fell short, each `whose`), with figures: what a
    /// words file must word, checked when a user's is loaded.
    pub fn examples() -> Vec<Found> {
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        let (requested, free, held) = (GIB, MIB, 2 * GIB);
        let short = [
            KvShort::Tokens { len: 8, tokens: 4 },
            KvShort::Bytes {
                len: 8,
                needed: GIB,
                left: MIB,
            },
            KvShort::NoRoom,
        ];
        let mut findings: Vec<Finding> = short
            .map(|short| Finding::KvShort {
                short,
                by_others: false,
            })
            .into();
        findings.extend([
            Finding::KvStartup {
                wanted: GIB,
                free,
                by_others: true,
            },
            Finding::Garbled,
            Finding::TooBig {
                requested,
                limit: MIB,
                of_cap: true,
            },
            Finding::Capped {
                allowed: GIB,
                held,
                requested,
                asked: requested,
                free: None,
            },
            Finding::Fits { requested, free },
            Finding::Others { requested, free },
            Finding::Fragmented {
                requested,
                unallocated: held,
            },
            Finding::SelfGrowth { requested, held },
            Finding::NvmlOthers { total: GIB },
            Finding::NvmlFull {
                used: GIB,
                total: 0,
            },
            Finding::ShortOfFree { requested, free },
            Finding::NoNumbers,
        ]);
        for whose in [Whose::OthersOrAsyncPool, Whose::Unseen, Whose::Others] {
            findings.push(Finding::Outside {
                requested,
                outside: held,
                held,
                whose,
            });
        }
        let f = Figures {
            total: Some(80 * GIB),
            ..Default::default()
        };
        findings
            .into_iter()
            .map(|finding| Found::of(finding, &f, &Holders::default()))
            .collect()
    }
}

/// A serving engine had no room for its KV cache in the share of the GPU it may use (vLLM's
/// `gpu_memory_utilization`, SGLang's `--mem-fraction-static`): the model's weights and its activation
/// peak took the rest. That share is its cap, unless other processes held memory, which the engines count
/// against it (they measure what is free).
fn kv_cache(f: &Figures) -> Option<Finding> {
    let kv = f.kv_cache.as_ref()?;
    let by_others = f.others > 0;
    if let (None, None, Some(wanted), Some(free)) =
        (kv.max_model_len, kv.tokens, kv.needed, kv.left)
    {
        // It refused to start: less of the GPU was free than its share asks for.
        return Some(Finding::KvStartup {
            wanted,
            free,
            by_others,
        });
    }
    let short = match (kv.max_model_len, kv.tokens, kv.needed, kv.left) {
        (Some(len), Some(tokens), ..) => KvShort::Tokens { len, tokens },
        (Some(len), _, Some(needed), Some(left)) => KvShort::Bytes { len, needed, left },
        _ => KvShort::NoRoom,
    };
    Some(Finding::KvShort { short, by_others })
}

/// One allocation larger than the process's cap or the whole device. A process that already held more
/// than the capacity the text gives had more than it to draw on (Windows lets a GPU's allocations spill
/// into the system's memory): that capacity is not what the request is too big for.
fn too_big(f: &Figures) -> Option<Finding> {
    let req = f.requested?;
    if req >= crate::oom::parse::EIB {
        return Some(Finding::Garbled);
    }
    let within = |t: u64| f.held().is_none_or(|h| h <= t);
    let (limit, of_cap) = match (f.allowed, f.total) {
        (Some(a), _) if req > a => (a, true),
        (_, Some(t)) if req > t && within(t) => (t, false),
        _ => return None,
    };
    Some(Finding::TooBig {
        requested: req,
        limit,
        of_cap,
    })
}

/// The process's cap, when it alone stopped the allocation: the GPU itself had room for it. A text that
/// gives no free memory (CuPy's pool checks its limit before it asks the device) needs none.
fn capped(f: &Figures) -> Option<Finding> {
    let (req, allowed) = (f.requested?, f.allowed?);
    let held = if f.cap_counts_process {
        f.process.or(f.reserved)
    } else {
        f.reserved.or(f.process)
    }
    .unwrap_or(0);
    let asked = f.segment.unwrap_or(req).max(req);
    if held + asked + f.slack <= allowed || f.free.is_some_and(|free| !clearly_fits(req, free)) {
        return None;
    }
    Some(Finding::Capped {
        allowed,
        held,
        requested: req,
        asked,
        free: f.free,
    })
}

fn fits(f: &Figures) -> Option<Finding> {
    let (requested, free) = (f.requested?, f.free?);
    clearly_fits(requested, free).then_some(Finding::Fits { requested, free })
}

fn others(f: &Figures) -> Option<Finding> {
    let (requested, free) = (f.requested?, f.free?);
    (f.others > 0 && free + f.others >= requested).then_some(Finding::Others { requested, free })
}

fn fragmented(f: &Figures) -> Option<Finding> {
    let (requested, unallocated) = (f.requested?, f.unallocated?);
    // Below `oom_fragmented_share_pct` of the cache, the GPU is full of live tensors (the table says why).
    let pct = params::OOM_FRAGMENTED_SHARE.uint();
    let worth = f
        .reserved
        .is_none_or(|r| unallocated.saturating_mul(100) >= r.saturating_mul(pct));
    (unallocated >= requested && worth).then_some(Finding::Fragmented {
        requested,
        unallocated,
    })
}

/// Memory in use that neither the failing process nor the job's others account for: other processes the
/// text could not name (older PyTorch names none).
fn outside(f: &Figures) -> Option<Finding> {
    let (requested, free, total, held) = (f.requested?, f.free?, f.total?, f.held()?);
    let outside = total.saturating_sub(free + held + f.job_others);
    if !(outside > held && outside + free >= requested) {
        return None;
    }
    let whose = if f.async_pool && f.others == 0 {
        // cudaMallocAsync gives what PyTorch frees back to CUDA's pool, which keeps it: the process's own
        // memory, outside PyTorch's figure. Only NVML's view of the processes tells the two apart.
        Whose::OthersOrAsyncPool
    } else if !f.vendor.nvml_sees() {
        // NVML cannot see the GPU, and where it shares the system's RAM (an APU, an integrated GPU) that
        // memory is the system's as much as other processes': nobody to name.
        Whose::Unseen
    } else {
        Whose::Others
    };
    Some(Finding::Outside {
        requested,
        outside,
        held,
        whose,
    })
}

fn self_growth(f: &Figures) -> Option<Finding> {
    let requested = f.requested?;
    f.allocated?;
    let held = f.held().filter(|&h| h > 0)?;
    Some(Finding::SelfGrowth { requested, held })
}

/// Without the allocator's numbers, NVML's view decides between others and the job.
fn nvml_only(f: &Figures) -> Option<Finding> {
    let (total, used) = (f.total?, f.device_used?);
    if f.others as u128 * 100 > total as u128 * params::OOM_OTHERS_SHARE.uint() as u128 {
        return Some(Finding::NvmlOthers { total });
    }
    (used as u128 * 100 > total as u128 * params::OOM_FULL.uint() as u128)
        .then_some(Finding::NvmlFull { used, total })
}

/// A text's figures of what was asked for and what was free (CatBoost's, XGBoost's, Paddle's, a TPU's),
/// and nothing of who held the rest.
fn short_of_free(f: &Figures) -> Option<Finding> {
    let (requested, free) = (f.requested?, f.free?);
    (requested > free).then_some(Finding::ShortOfFree { requested, free })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_xla_texts_cap_is_set_by_xlas_fraction_not_pytorchs() {
        let t = crate::oom::text::empty(Kind::Xla, "bfc-xla");
        assert!(
            cap_setting(&t).starts_with("XLA_PYTHON_CLIENT_MEM_FRACTION"),
            "{}",
            cap_setting(&t)
        );
    }

    const GIB: u64 = 1 << 30;

    // The words of each finding are `rules/words/oom-cause.toml`'s, tested with them in `rules::words`.

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
        assert_eq!(cause_of(&f).cause(), Cause::Unknown);
    }

    #[test]
    fn a_small_request_near_a_cap_is_checked_against_the_segment_pytorch_asks_for() {
        assert_eq!(
            [1, MIB, MIB + 1, 10 * MIB - 1, 10 * MIB, 11 * MIB].map(torch_segment),
            [2 * MIB, 2 * MIB, 20 * MIB, 20 * MIB, 10 * MIB, 12 * MIB]
        );
        // TheRock#2118: 2 MiB asked, 1072 MiB held, 1.05 GiB allowed: the 20 MiB segment does not fit.
        let t = crate::oom::parse::parse_line("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 255.98 GiB of which 244.65 GiB is free. 1.05 GiB allowed; Of the allocated memory 1017.01 MiB is allocated by PyTorch, with 17.00 MiB allocated in private pools (e.g., HIP Graphs), and 54.99 MiB is reserved by PyTorch but unallocated.").unwrap();
        let f = Figures::of(&t, &Holders::default(), 0, None, None);
        assert_eq!(cause_of(&f).cause(), Cause::Cap);
        // Far under the cap, with the GPU's memory free: not the cap.
        let under = Figures {
            reserved: Some(MIB),
            ..f
        };
        assert_eq!(cause_of(&under).cause(), Cause::Unknown);
    }

    #[test]
    fn the_finding_is_data_with_the_figures_it_rests_on() {
        // TheRock#2118 again: what was found, not a sentence, is what the decider gives.
        let t = crate::oom::parse::parse_line("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 255.98 GiB of which 244.65 GiB is free. 1.05 GiB allowed; Of the allocated memory 1017.01 MiB is allocated by PyTorch, with 17.00 MiB allocated in private pools (e.g., HIP Graphs), and 54.99 MiB is reserved by PyTorch but unallocated.").unwrap();
        let f = Figures::of(&t, &Holders::default(), 0, None, None);
        let found = cause_of(&f);
        assert!(
            matches!(found, Finding::Capped { requested, asked, free: Some(_), .. }
                if requested == 2 * MIB && asked == 20 * MIB),
            "{found:?}"
        );
        assert_eq!(found.cause(), Cause::Cap);
        let none = cause_of(&Figures::default());
        assert_eq!((none, none.cause()), (Finding::NoNumbers, Cause::Unknown));
        // As the report keeps it and its words read it: the kind, its figures, and the names beside them.
        let kept = serde_json::to_value(Found::of(found, &f, &Holders::default())).unwrap();
        assert_eq!(kept["kind"], "capped");
        assert_eq!(kept["asked"], 20 * MIB);
        assert_eq!(
            kept["cap_setting"],
            "torch.cuda.set_per_process_memory_fraction"
        );
        assert_eq!(
            serde_json::from_value::<Found>(kept).unwrap().finding,
            found
        );
        let short = Finding::KvShort {
            short: KvShort::Tokens { len: 8, tokens: 4 },
            by_others: false,
        };
        let kept = serde_json::to_value(Found::of(short, &f, &Holders::default())).unwrap();
        assert_eq!(
            (&kept["kind"], &kept["short"], &kept["tokens"]),
            (&"kv_short".into(), &"tokens".into(), &4.into())
        );
        assert_eq!(
            serde_json::from_value::<Found>(kept).unwrap().finding,
            short
        );
    }
}
