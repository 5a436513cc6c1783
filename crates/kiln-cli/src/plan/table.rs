//! `kiln plan`'s table: the workload, the cluster, the best candidates and the choice.

use std::fmt::Write;

use kiln_core::plan::cost::{Candidate, Cluster, Planned, Workload};

const GIB: f64 = (1u64 << 30) as f64;

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
        "Model: {name}: {:.2} B parameters, {:.3} TFLOPs forward per sample, global batch {}.",
        work.params as f64 / 1e9,
        work.forward_flops / 1e12,
        work.global_batch
    );
    let _ = writeln!(
        out,
        "Devices: {} ({} per machine), {:.0} GiB each, {:.0} TFLOP/s peak at {:.0} % \
         efficiency, {:.0} GB/s within a machine, {:.0} GB/s across.",
        cluster.devices,
        cluster.per_node,
        cluster.memory as f64 / GIB,
        cluster.peak_flops / 1e12,
        cluster.efficiency * 100.0,
        cluster.intra_bandwidth / 1e9,
        cluster.inter_bandwidth / 1e9
    );
    let _ = writeln!(
        out,
        "\n| # | strategy | dp | pp | tp | micro-batches | GiB/device (weights+state+act) \
         | ms/step (compute+bubble+dp+tp+pp) | MFU | verdict |\n\
         | ---: | --- | ---: | ---: | ---: | --- | --- | --- | ---: | --- |"
    );
    for (i, c) in planned.candidates.iter().take(top).enumerate() {
        let _ = writeln!(out, "{}", row(i + 1, c));
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

fn row(i: usize, c: &Candidate) -> String {
    let l = &c.layout;
    let (m, t) = (&c.memory, &c.time);
    let ms = |s: f64| s * 1e3;
    format!(
        "| {i} | {} | {} | {} | {} | {} × {}{} | {:.1} ({:.1}+{:.1}+{:.1}) | {:.0} \
         ({:.0}+{:.0}+{:.0}+{:.0}+{:.0}) | {:.0} % | {} |",
        c.strategy.name(),
        l.dp,
        l.pp,
        l.tp,
        l.micro_batches,
        l.micro_batch,
        if l.recompute { ", recomputed" } else { "" },
        m.total / GIB,
        m.weights / GIB,
        m.trainable_state / GIB,
        m.activations / GIB,
        ms(t.total),
        ms(t.compute),
        ms(t.bubble),
        ms(t.data_parallel),
        ms(t.tensor_parallel),
        ms(t.pipeline),
        c.utilisation * 100.0,
        c.rejected.as_deref().unwrap_or("fits")
    )
}
