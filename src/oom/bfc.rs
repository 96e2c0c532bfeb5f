//! The figures TensorFlow's and XLA's BFC allocator prints after its "ran out of memory" warning, before
//! the error that reports the failure: `Total bytes in pool: N memory_limit_: M` (TensorFlow 2.12 and
//! later; `total_region_allocated_bytes_: N memory_limit_: M` before) and its `Stats:` block, a figure a
//! line (`Limit:`, `InUse:`, `MaxInUse:`, `NumAllocs:`, `MaxAllocSize:`, then `Reserved:`,
//! `PeakReserved:`, `LargestFreeBlock:` in newer releases). Thousands of lines of bins and chunks may come
//! between the warning and the block; each line is looked at for these words only.

use super::parse::OomText;
use regex::Regex;
use std::sync::LazyLock;

/// Lines after the warning in which its figures may come (a pool of tens of GiB lists its chunks a line
/// each, and a line is a substring search here).
pub const LINES: u32 = 200_000;

static POOL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?:Total bytes in pool|total_region_allocated_bytes_): ?(\d+) memory_limit_: ?(\d+)",
    )
    .unwrap()
});
static STAT: LazyLock<Regex> = LazyLock::new(|| {
    // A figure ends its line; a logger's prefix may come before it.
    Regex::new(
        r"(?:^|\s)(Limit|InUse|MaxInUse|NumAllocs|MaxAllocSize|LargestFreeBlock):\s+(\d+)\s*$",
    )
    .unwrap()
});

/// Reads one line of the allocator's dump into `t`; whether the dump is over (its last figure read).
pub fn read(t: &mut OomText, line: &str) -> bool {
    if line.contains("memory_limit_") {
        if let Some(c) = POOL.captures(line) {
            t.reserved_bytes = c[1].parse().ok();
            t.allowed_bytes = c[2].parse().ok();
        }
        return false;
    }
    let Some(c) = STAT.captures(line) else {
        return false;
    };
    let n: Option<u64> = c[2].parse().ok();
    match &c[1] {
        // 0 means the allocator knows no limit.
        "Limit" => t.allowed_bytes = n.filter(|&l| l > 0).or(t.allowed_bytes),
        "InUse" => t.allocated_bytes = n,
        "MaxInUse" => t.peak_allocated_bytes = n,
        "NumAllocs" => t.allocations = n,
        "MaxAllocSize" => t.largest_alloc_bytes = n,
        _ => return true,
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oom::parse::Kind;
    use crate::oom::text::empty;

    #[test]
    fn a_stats_block_gives_the_pool_its_limit_and_what_was_in_use() {
        // fixtures/oom/real/tf_bfc_stats_keras_fit.txt (a Keras fit on an A100), its bins and chunks left out.
        let mut t = empty(Kind::Tensorflow, "bfc");
        let lines = [
            "2024-07-12 14:20:01.747548: I tensorflow/tsl/framework/bfc_allocator.cc:1109] Total bytes in pool: 40231108608 memory_limit_: 40231108608 available bytes: 0 curr_region_allocation_bytes_: 80462217216",
            "2024-07-12 14:20:01.747561: I tensorflow/tsl/framework/bfc_allocator.cc:1114] Stats: ",
            "Limit:                     40231108608",
            "InUse:                     39851412480",
            "MaxInUse:                  39875904000",
            "NumAllocs:                     2797476",
            "MaxAllocSize:              13200000000",
            "Reserved:                            0",
        ];
        assert!(lines.iter().all(|l| !read(&mut t, l)));
        assert!(read(&mut t, "LargestFreeBlock:                    0"));
        assert_eq!(t.reserved_bytes, Some(40231108608));
        assert_eq!(t.allowed_bytes, Some(40231108608));
        assert_eq!(t.allocated_bytes, Some(39851412480));
        assert_eq!(t.peak_allocated_bytes, Some(39875904000));
        assert_eq!(t.allocations, Some(2797476));
        assert_eq!(t.largest_alloc_bytes, Some(13200000000));
    }

    #[test]
    fn older_words_and_a_chunk_line_that_says_inuse_are_read_right() {
        let mut t = empty(Kind::Tensorflow, "bfc");
        read(
            &mut t,
            "I tensorflow/core/common_runtime/bfc_allocator.cc:1103] total_region_allocated_bytes_: 7365066752 memory_limit_: 7365066752 available bytes: 0 curr_region_allocation_bytes_: 14730133504",
        );
        read(
            &mut t,
            "I tensorflow/core/common_runtime/bfc_allocator.cc:1031] InUse at f00954100 of size 512 next 95",
        );
        assert_eq!(t.allocated_bytes, None, "a chunk of the dump is no figure");
        read(&mut t, "    InUse:                      7151588096");
        read(
            &mut t,
            "2024-05-01 12:00:01,123 ERROR [worker]: MaxInUse:   7151588352",
        );
        assert_eq!(
            (t.reserved_bytes, t.allocated_bytes, t.peak_allocated_bytes),
            (Some(7365066752), Some(7151588096), Some(7151588352))
        );
    }
}
