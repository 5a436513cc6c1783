//! `kiln plan`'s table: the workload, the cluster, the best candidates and the choice.

use std::fmt::Write;

use kiln_core::plan::cost::{Candidate, Cluster, Planned, StageSplit, Workload, size as bytes};

/// The table `kiln plan` prints: the `top` best candidates.
pub fn render(
    name: &str,
    work: &Workload,
    cluster: &Cluster,
    planned: &Planned,
    top: usize,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Model: {name}: {} parameters ({} training), {}FLOPs forward per sample, global \
         batch {}.",
        count(work.params as f64),
        count(work.trainable as f64),
        count(work.forward_flops),
        work.global_batch
    );
    match &cluster.measured {
        None => {
            let _ = writeln!(
                out,
                "Devices: {} ({} per machine), {}, {:.0} TFLOP/s peak at {:.0} % \
                 efficiency, {:.0} GB/s within a machine, {:.0} GB/s across.",
                cluster.devices,
                cluster.per_node,
                memories(cluster),
                cluster.peak_flops / 1e12,
                cluster.efficiency * 100.0,
                cluster.intra_bandwidth / 1e9,
                cluster.inter_bandwidth / 1e9
            );
        }
        Some(m) => {
            let _ = writeln!(
                out,
                "Devices: {} ranks on {} CPU core(s), {} each. Measured on one core: {} µs a \
                 sample, {} µs a micro-batch, {} µs an update ({:.2}× alone); the collective \
                 {:.1} µs a step and {:.1} GB/s; ranks meet in {} µs a step and hand a \
                 micro-batch on in {} µs more; shards meet in {} µs an all-reduce and run \
                 {:.0} % of a block's work whole; ranks beyond the cores go {:.0} % of the way \
                 from sharing them evenly to the most crowded core's pace.",
                cluster.devices,
                cluster.cores.unwrap_or(cluster.devices),
                bytes(cluster.memory as f64),
                us(m.per_sample),
                us(m.per_micro_batch),
                us(m.per_update),
                m.alone,
                cluster.intra_latency * 1e6,
                cluster.intra_bandwidth / 1e9,
                us(m.rendezvous),
                us(m.handoff),
                us(m.tp_call),
                m.tp_unsplit * 100.0,
                m.crowded * 100.0
            );
        }
    }
    let _ = writeln!(
        out,
        "\n| # | strategy | dp | pp | tp | micro-batches | per device (weights + state + \
         activations + buckets) | step (compute + update + bubble + dp + tp + pp + sync) | \
         MFU | verdict |\n\
         | ---: | --- | ---: | ---: | ---: | --- | --- | --- | ---: | --- |"
    );
    for (i, c) in planned.candidates.iter().take(top).enumerate() {
        let _ = writeln!(out, "{}", row(i + 1, c, cluster.unequal()));
    }
    let shown = top.min(planned.candidates.len());
    if shown < planned.candidates.len() {
        let _ = writeln!(
            out,
            "({} more: --top {} or --json)",
            planned.candidates.len() - shown,
            planned.candidates.len()
        );
    }
    let _ = writeln!(out, "\nChosen: {}", planned.reason);
    out
}

/// The devices' memory: `80.0 GiB each`, or each device's where they differ, with the limits
/// set on any (`24.0 GiB, 12.0 GiB (limited to 10.0 GiB)`).
fn memories(cluster: &Cluster) -> String {
    let margin = match cluster.margin {
        Some(margin) => format!(" ({} kept free on each)", bytes(margin as f64)),
        None => String::new(),
    };
    if cluster.device_memory.is_empty() && cluster.max_memory.is_empty() {
        return format!("{} each{margin}", bytes(cluster.memory as f64));
    }
    let each: Vec<String> = (0..cluster.devices.min(MOST_LISTED))
        .map(|d| match cluster.max_memory.get(&d) {
            Some(&limit) => format!(
                "{} (limited to {})",
                bytes(cluster.device_bytes(d) as f64),
                bytes(limit as f64)
            ),
            None => bytes(cluster.device_bytes(d) as f64),
        })
        .collect();
    let more = cluster.devices.saturating_sub(MOST_LISTED);
    match more {
        0 => format!("{}{margin}", each.join(", ")),
        _ => format!("{}, … ({more} more){margin}", each.join(", ")),
    }
}

/// Devices whose memory the description lists one by one.
const MOST_LISTED: usize = 16;

/// `n` with a unit prefix: 6.74 G, 40.0 M, 512.
fn count(n: f64) -> String {
    match n {
        n if n >= 1e12 => format!("{:.2} T", n / 1e12),
        n if n >= 1e9 => format!("{:.2} G", n / 1e9),
        n if n >= 1e6 => format!("{:.1} M", n / 1e6),
        n if n >= 1e3 => format!("{:.1} k", n / 1e3),
        n => format!("{n:.0} "),
    }
}

/// `s` seconds in microseconds, three significant digits.
fn us(s: f64) -> String {
    match s * 1e6 {
        us if us >= 100.0 => format!("{us:.0}"),
        us if us >= 1.0 => format!("{us:.1}"),
        us => format!("{us:.3}"),
    }
}

/// `s` seconds in milliseconds, three significant digits for short steps.
fn ms(s: f64) -> String {
    match s * 1e3 {
        ms if ms >= 100.0 => format!("{ms:.0}"),
        ms if ms >= 1.0 => format!("{ms:.1}"),
        ms => format!("{ms:.3}"),
    }
}

/// One candidate's row; `by_device` names the device its memory is for (the fullest, where
/// the devices differ).
fn row(i: usize, c: &Candidate, by_device: bool) -> String {
    let l = &c.layout;
    let (m, t) = (&c.memory, &c.time);
    format!(
        "| {i} | {} | {} | {} | {} | {} × {}{}{} | {}{} ({} + {} + {} + {}) \
         | {} ms ({} + {} + {} + {} + {} + {} + {}) | {:.0} % | {} |",
        match l.shard_state.zero_stage() {
            0 => c.strategy.name().to_string(),
            stage => format!("{} ZeRO-{stage}", c.strategy.name()),
        },
        l.dp,
        l.pp,
        l.tp,
        l.micro_batches,
        l.micro_batch,
        l.recomputation(),
        match l.split {
            StageSplit::Even => String::new(),
            split => format!(", {} stages of {}", split.name(), join(&c.blocks)),
        },
        bytes(m.total),
        match by_device {
            true => format!(" on device {}", m.device),
            false => String::new(),
        },
        bytes(m.weights),
        bytes(m.trainable_state),
        bytes(m.activations),
        bytes(m.buckets),
        ms(t.total),
        ms(t.compute),
        ms(t.update),
        ms(t.bubble),
        ms(t.data_parallel),
        ms(t.tensor_parallel),
        ms(t.pipeline),
        ms(t.sync),
        c.utilisation * 100.0,
        c.rejected.as_deref().unwrap_or("fits")
    )
}

/// Blocks per stage as `17+15`.
fn join(blocks: &[usize]) -> String {
    let parts: Vec<String> = blocks.iter().map(usize::to_string).collect();
    parts.join("+")
}
