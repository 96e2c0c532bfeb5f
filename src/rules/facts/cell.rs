//! A notebook's cells (`torch.cell*`): the cell whose runs each left more allocated.

use super::TorchFacts;

/// The notebook cell that leaks most (`torch.cell*`).
pub(super) fn cell_facts(cells: &[crate::torch::cells::Cell]) -> TorchFacts {
    let Some(l) = crate::torch::cells::leak(cells) else {
        return TorchFacts::default();
    };
    TorchFacts {
        cell: Some(l.label),
        cell_runs: l.runs as i64,
        cell_numbers: l.numbers.iter().map(|&n| n as i64).collect(),
        cell_growth_bytes_per_run: l.bytes_per_run,
        cell_growth_bytes: l.total_bytes as i64,
        ..TorchFacts::default()
    }
}
