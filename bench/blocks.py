"""Blocks of training steps timed with something on and off within one run (bench/sampling_cost.py,
bench/shim_cost.py): their medians and spread, and the cost of "on"."""
import statistics as st


def compare(on, off):
    """`on`, `off`: milliseconds a step, one per block. The medians, the cost in percent and the
    interquartile ranges."""
    m_on, m_off = st.median(on), st.median(off)
    return {"blocks": [len(on), len(off)],
            "ms_per_step_on": round(m_on, 4), "ms_per_step_off": round(m_off, 4),
            "cost_pct": round((m_on / m_off - 1) * 100, 3),
            "iqr_on": [round(x, 4) for x in st.quantiles(on, n=4)[::2]],
            "iqr_off": [round(x, 4) for x in st.quantiles(off, n=4)[::2]]}
