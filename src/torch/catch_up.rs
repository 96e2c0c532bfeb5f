//! A copy of the framework view brought up to date with the shim's records since the last look, as
//! [`crate::timeline::Timeline::catch_up`] does for NVML's: the looks at a run in progress keep one, so
//! that no look copies the whole of the allocator's series. Every field is named, so that a new one is
//! not forgotten here.

use super::{StepLog, TorchProc, TorchTimeline};

impl TorchTimeline {
    /// Brings this copy of `source` up to date: each process' series and step log take only what they
    /// lack; the rest (the shim's events: OOMs, hunts, cells, errors; bounded by the run's events, not
    /// its length) is copied.
    pub fn catch_up(&mut self, source: &TorchTimeline) {
        let TorchTimeline {
            procs,
            frameworks,
            ooms,
            versions,
            errors,
            messages,
            bad_lines,
            hunts,
            inside,
            snapshot_file,
        } = source;
        self.procs.retain(|k, _| procs.contains_key(k));
        for (k, p) in procs {
            match self.procs.get_mut(k) {
                Some(mine) => mine.catch_up(p),
                None => {
                    self.procs.insert(*k, p.clone());
                }
            }
        }
        self.frameworks.clone_from(frameworks);
        self.ooms.clone_from(ooms);
        self.versions.clone_from(versions);
        self.errors.clone_from(errors);
        self.messages = *messages;
        self.bad_lines = *bad_lines;
        self.hunts.clone_from(hunts);
        self.inside.clone_from(inside);
        self.snapshot_file.clone_from(snapshot_file);
    }
}

impl TorchProc {
    fn catch_up(&mut self, source: &TorchProc) {
        let TorchProc {
            pid,
            framework,
            rank,
            local_rank,
            device,
            uuid,
            allocated,
            reserved,
            inactive_split,
            peak_allocated,
            peak_reserved,
            alloc_retries,
            ooms,
            device_allocs,
            device_frees,
            steps,
            last_step,
            record_every,
            shim_cost_us,
            covered_us,
            cells,
            first_work_s,
            limit,
            largest_free_block,
            allocations,
            free_blocks,
            pinned_free_blocks,
        } = source;
        (self.pid, self.framework, self.device) = (*pid, *framework, *device);
        self.rank.clone_from(rank);
        self.local_rank.clone_from(local_rank);
        self.uuid.clone_from(uuid);
        self.allocated.catch_up(allocated);
        self.reserved.catch_up(reserved);
        self.inactive_split.catch_up(inactive_split);
        (self.peak_allocated, self.peak_reserved) = (*peak_allocated, *peak_reserved);
        (self.alloc_retries, self.ooms) = (*alloc_retries, *ooms);
        (self.device_allocs, self.device_frees) = (*device_allocs, *device_frees);
        self.steps.catch_up(steps);
        (self.last_step, self.record_every) = (*last_step, *record_every);
        (self.shim_cost_us, self.covered_us) = (*shim_cost_us, *covered_us);
        self.cells.clone_from(cells);
        self.first_work_s = *first_work_s;
        (self.limit, self.largest_free_block) = (*limit, *largest_free_block);
        (self.allocations, self.free_blocks) = (*allocations, *free_blocks);
        self.pinned_free_blocks = *pinned_free_blocks;
    }
}

impl StepLog {
    /// Takes the records this copy lacks: a log only grows at its end until it is full, when it drops
    /// every other record and doubles its stride (then it is copied again: once per doubling).
    fn catch_up(&mut self, source: &StepLog) {
        let kept = self.steps.len();
        let same = self.stride == source.stride
            && kept <= source.steps.len()
            && kept.checked_sub(1).map(|i| &source.steps[i]) == self.steps.last();
        if !same {
            self.clone_from(source);
            return;
        }
        self.steps.extend_from_slice(&source.steps[kept..]);
        self.total = source.total;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MAX_STEPS, Step};
    use super::*;

    #[test]
    fn a_step_log_caught_up_now_and_then_is_the_log_through_its_thinning() {
        let mut log = StepLog::default();
        let mut copy = StepLog::default();
        for i in 0..(MAX_STEPS as u64 * 5) {
            log.push(Step {
                step: i,
                at_s: i as f64,
                ..Step::default()
            });
            if i % 333 == 0 || i % 1000 == 7 {
                copy.catch_up(&log);
                assert_eq!(copy, log, "at step {i}");
            }
        }
        assert!(log.stride > 2, "the log thinned: {}", log.stride);
    }
}
