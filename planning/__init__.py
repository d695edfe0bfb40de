"""Pure planning, imported by workflows and activities alike: the portfolio planner and its
costs, the fallback arbiter, the token bucket. No I/O, no clocks, no Temporal: every function
here is deterministic in its inputs, so workflows replay it and activities may call it."""
