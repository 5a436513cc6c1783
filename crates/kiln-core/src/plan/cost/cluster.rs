//! The devices a plan runs on: how many, how they group into machines, and what each can
//! hold, compute and move.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Measured;

/// The share of a device's memory a plan may fill: the rest is for the framework, kernels'
/// workspaces and the allocator's fragmentation. A limit the user sets
/// ([`Cluster::max_memory`]) replaces it.
pub const USABLE_MEMORY: f64 = 0.9;

/// Step times closer than this share are the same to the model, whose error is larger: the
/// simpler layout of the two is chosen (a measured cluster may widen it:
/// [`Cluster::tolerance`]).
pub const CLOSE: f64 = 0.05;

/// Devices, their machines and their links.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// Devices in all.
    pub devices: usize,
    /// Devices per machine (node): groups within one talk over the fast link.
    pub per_node: usize,
    /// Bytes of memory per device (each device's where [`Cluster::device_memory`] lists them).
    pub memory: u64,
    /// Each device's memory, by rank, where the devices differ (`kiln plan --device-memory
    /// 24GiB,12GiB`; CUDA's free memory at start): one per device, or none when every device
    /// has `memory`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_memory: Vec<u64>,
    /// What a plan may fill of a device, by rank (`--max-memory 0=10GiB`), in place of
    /// [`USABLE_MEMORY`] of its memory: Accelerate's `max_memory`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub max_memory: BTreeMap<usize, u64>,
    /// Bytes a plan leaves free on every device without a limit of its own
    /// (`--memory-margin 2GiB`), in place of the [`USABLE_MEMORY`] share: on CUDA, of the
    /// memory free at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin: Option<u64>,
    /// Dense FLOP/s of one device at its peak.
    pub peak_flops: f64,
    /// The share of the peak a real training step reaches (0.5: half).
    pub efficiency: f64,
    /// Bytes per second one device moves to another of its machine.
    pub intra_bandwidth: f64,
    /// Bytes per second one device moves to a device of another machine.
    pub inter_bandwidth: f64,
    /// Seconds one collective step costs before any byte moves, within a machine and across.
    pub intra_latency: f64,
    /// See `intra_latency`.
    pub inter_latency: f64,
    /// When the devices are ranks sharing a CPU: its cores. More ranks than cores take turns:
    /// see [`Cluster::crowding`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<usize>,
    /// The workload's step timed on one of these devices, which then replaces the FLOPs over
    /// `peak_flops · efficiency` (a model that is here to run: [`Measured`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<Measured>,
}

/// Per-device memory that cannot describe the cluster.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitError {
    /// A memory list of another length than the devices.
    #[error(
        "{listed} device memories are listed for {devices} devices; list one per device, or \
         one size for all"
    )]
    Listed {
        /// Sizes listed.
        listed: usize,
        /// Devices.
        devices: usize,
    },
    /// A limit for a device the run does not have.
    #[error(
        "a memory limit is set for device {device}, but the run has {devices} device(s) \
         (0 to {last}); limit only those"
    )]
    NotInWorld {
        /// The device.
        device: usize,
        /// Devices.
        devices: usize,
        /// The last device's index.
        last: usize,
    },
    /// A margin that leaves a device nothing.
    #[error(
        "a memory margin of {} leaves nothing of device {device}'s {}; give a smaller margin",
        size(*margin as f64),
        size(*memory as f64)
    )]
    MarginTooLarge {
        /// The margin, bytes.
        margin: u64,
        /// The device it empties.
        device: usize,
        /// The device's memory, bytes.
        memory: u64,
    },
    /// A limit above the device's memory.
    #[error(
        "device {device} is limited to {} but has {}; give it at most its memory",
        size(*limit as f64),
        size(*memory as f64)
    )]
    AboveDevice {
        /// The device.
        device: usize,
        /// The limit, bytes.
        limit: u64,
        /// The device's memory, bytes.
        memory: u64,
    },
}

impl Cluster {
    /// Device `device`'s memory in bytes.
    pub fn device_bytes(&self, device: usize) -> u64 {
        self.device_memory
            .get(device)
            .copied()
            .unwrap_or(self.memory)
    }

    /// Bytes a plan may fill of device `device`: its limit where one is set, else
    /// [`USABLE_MEMORY`] of its memory.
    pub fn usable(&self, device: usize) -> f64 {
        let memory = self.device_bytes(device);
        match (self.max_memory.get(&device), self.margin) {
            (Some(&limit), _) => limit as f64,
            (None, Some(margin)) => memory.saturating_sub(margin) as f64,
            (None, None) => memory as f64 * USABLE_MEMORY,
        }
    }

    /// Whether what a plan may fill is not simply 90 % of one size: the devices differ, or
    /// limits or a margin are set.
    pub fn unequal(&self) -> bool {
        !self.device_memory.is_empty() || !self.max_memory.is_empty() || self.margin.is_some()
    }

    /// Checks the per-device memory: a size per device, limits on devices of the cluster and
    /// within their memory.
    ///
    /// # Errors
    /// [`LimitError`] naming the device and the fix.
    pub fn check_limits(&self) -> Result<(), LimitError> {
        if !self.device_memory.is_empty() && self.device_memory.len() != self.devices {
            return Err(LimitError::Listed {
                listed: self.device_memory.len(),
                devices: self.devices,
            });
        }
        if let Some(margin) = self.margin {
            let smallest = (0..self.devices)
                .filter(|d| !self.max_memory.contains_key(d))
                .map(|d| (d, self.device_bytes(d)))
                .min_by_key(|&(_, bytes)| bytes);
            if let Some((device, memory)) = smallest
                && margin >= memory
            {
                return Err(LimitError::MarginTooLarge {
                    margin,
                    device,
                    memory,
                });
            }
        }
        for (&device, &limit) in &self.max_memory {
            if device >= self.devices {
                return Err(LimitError::NotInWorld {
                    device,
                    devices: self.devices,
                    last: self.devices.saturating_sub(1),
                });
            }
            let memory = self.device_bytes(device);
            if limit > memory {
                return Err(LimitError::AboveDevice {
                    device,
                    limit,
                    memory,
                });
            }
        }
        Ok(())
    }

    /// FLOP/s a device reaches on a training step.
    pub fn flops(&self) -> f64 {
        self.peak_flops * self.efficiency
    }

    /// Step times closer than this share are the same to the planner: [`CLOSE`], or the
    /// precision of the measured steps' medians when it is coarser ([`Measured::noise`]: a
    /// step on a shared machine may be timed less precisely than the cost model errs).
    pub fn tolerance(&self) -> f64 {
        let noise = self.measured.as_ref().map_or(0.0, Measured::noise);
        CLOSE.max(noise)
    }

    /// How much slower a step runs than on devices of their own: ranks beyond the cores take
    /// turns, and since every rank waits for the others at each step's collectives, the step
    /// goes at most at the pace of the most crowded core, `⌈devices / cores⌉` ranks on one,
    /// and at least at the cores' time divided evenly, `devices / cores`. Where the pace lies
    /// between is the model's [`Measured::crowded`] share: 3 replicas of the transformer on 2
    /// cores ran as slowly as 4 (12.4 ms against 9.8), where the MLP's, whose ranks sleep
    /// through much of so short a step, ran 9 to 26 % faster than that. Without a measured
    /// share, the most crowded core's pace.
    pub fn crowding(&self) -> f64 {
        match self.cores {
            Some(cores) if self.devices > cores && cores > 0 => {
                let even = self.devices as f64 / cores as f64;
                let turns = self.devices.div_ceil(cores) as f64;
                let share = self.measured.as_ref().map_or(1.0, |m| m.crowded);
                even + share.clamp(0.0, 1.0) * (turns - even)
            }
            _ => 1.0,
        }
    }

    /// Copies of its gradients' buckets the most loaded replica holds. On devices of their
    /// own, one: its own, which the reduced result replaces. Ranks sharing one memory meet in
    /// Kiln's in-process collective, which sums every replica's buckets into one buffer (the
    /// first replica's, where the backend adds in place) and hands them all that buffer.
    /// Each replica unflattens it into its gradients, and the first gradient of each bucket
    /// stays a view of it (Flex reshapes a slice at offset 0 without copying), so the buffer
    /// stays on its owner's account until every replica has updated, while the owner goes on
    /// to its own update: at its peak, about a second copy.
    ///
    /// Two is measured, not derived: in nine counted runs of 2 to 4 MLP replicas (27 KiB of
    /// gradients) the most loaded rank held 6 to 89 KB more than the least, and it was the
    /// first in eight; with two, 224 rows of `kiln bench plan` read within 6.5 %. A launched
    /// CPU run of one rank a process holds one (its buffer is its own), and is counted two:
    /// one copy of its gradients high.
    pub fn bucket_copies(&self) -> f64 {
        match self.cores {
            Some(_) => 2.0,
            None => 1.0,
        }
    }

    /// How much slower (or faster) a measured step runs for the cores left idle: the step was
    /// timed beside a copy on every other core, as when every core holds a rank; with fewer
    /// ranks than cores it moves towards the step timed alone ([`Measured::alone`]), in
    /// proportion to the cores that idle.
    pub fn company(&self) -> f64 {
        match (self.cores, &self.measured) {
            (Some(cores), Some(m)) if cores > 1 && self.devices < cores => {
                let busy = self.devices.saturating_sub(1) as f64 / (cores - 1) as f64;
                m.alone + (1.0 - m.alone) * busy
            }
            _ => 1.0,
        }
    }
}

/// Data-centre GPUs, by the names `--device` takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preset {
    /// The name.
    pub name: &'static str,
    /// Bytes of memory.
    pub memory: u64,
    /// Dense bf16 peak, in TFLOP/s.
    pub peak_tflops: f64,
    /// Per-direction NVLink bandwidth, GB/s.
    pub intra_gbps: f64,
    /// Per-GPU network bandwidth, GB/s (one 400 Gb/s or 200 Gb/s adapter per GPU).
    pub inter_gbps: f64,
}

const GIB: u64 = 1 << 30;

/// The GPUs `--device` knows: vendors' data sheets (dense bf16, no sparsity).
pub const PRESETS: [Preset; 4] = [
    Preset {
        name: "h100-sxm",
        memory: 80 * GIB,
        peak_tflops: 989.0,
        intra_gbps: 450.0,
        inter_gbps: 50.0,
    },
    Preset {
        name: "h200",
        memory: 141_000_000_000,
        peak_tflops: 989.0,
        intra_gbps: 450.0,
        inter_gbps: 50.0,
    },
    Preset {
        name: "a100-80g",
        memory: 80 * GIB,
        peak_tflops: 312.0,
        intra_gbps: 300.0,
        inter_gbps: 25.0,
    },
    Preset {
        name: "a100-40g",
        memory: 40 * GIB,
        peak_tflops: 312.0,
        intra_gbps: 300.0,
        inter_gbps: 25.0,
    },
];

/// The share of peak FLOP/s a large transformer's training step reaches on a GPU when nobody
/// says: about what Megatron-LM and PaLM report (40 to 55 % model FLOPs utilisation).
pub const DEFAULT_EFFICIENCY: f64 = 0.5;

impl Preset {
    /// The preset named `name`.
    pub fn named(name: &str) -> Option<Preset> {
        PRESETS.iter().copied().find(|p| p.name == name)
    }

    /// `devices` of these, `per_node` to a machine, reaching `efficiency` of their peak.
    pub fn cluster(&self, devices: usize, per_node: usize, efficiency: f64) -> Cluster {
        Cluster {
            devices,
            per_node,
            memory: self.memory,
            peak_flops: self.peak_tflops * 1e12,
            efficiency,
            intra_bandwidth: self.intra_gbps * 1e9,
            inter_bandwidth: self.inter_gbps * 1e9,
            intra_latency: 5e-6,
            inter_latency: 10e-6,
            cores: None,
            measured: None,
            device_memory: Vec::new(),
            max_memory: BTreeMap::new(),
            margin: None,
        }
    }
}

/// Reads a size such as `80GiB`, `141GB`, `512MiB` or `1000000` (bytes).
///
/// # Errors
/// What is wrong with the text, in words.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size: give a number and a unit, as 80GiB"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => GIB as f64,
        "tib" => GIB as f64 * 1024.0,
        other => {
            return Err(format!(
                "`{other}` is not a unit of size: use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
            ));
        }
    };
    let bytes = number * scale;
    // A byte is the least a device holds, and 2^60 (an exbibyte) far more than any does:
    // beyond it the value would be cut to 2^64 − 1 without a word.
    if !(1.0..=MOST_BYTES).contains(&bytes) {
        return Err(format!(
            "`{text}` is not a device's memory: give 1 byte to 1 EiB, as 80GiB"
        ));
    }
    Ok(bytes as u64)
}

/// `bytes` in the largest binary unit that keeps a digit before the point: `12.0 GiB`,
/// `640.0 KiB` (what [`parse_bytes`] reads back).
pub fn size(bytes: f64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    match bytes.abs() {
        b if b >= GIB as f64 => format!("{:.1} GiB", bytes / GIB as f64),
        b if b >= MIB => format!("{:.1} MiB", bytes / MIB),
        _ => format!("{:.1} KiB", bytes / 1024.0),
    }
}

/// Reads per-device memory limits as Accelerate's `max_memory` names them, `0=10GiB,1=8GiB`:
/// a device index and a size ([`parse_bytes`]) for each limited device.
///
/// # Errors
/// What is wrong with the text, in words.
pub fn parse_limits(text: &str) -> Result<BTreeMap<usize, u64>, String> {
    let mut limits = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (device, size) = part.split_once('=').ok_or_else(|| {
            format!("`{part}` is not a device's limit: give its index and a size, as 0=10GiB")
        })?;
        let device: usize = device.trim().parse().map_err(|_| {
            format!("`{device}` in `{part}` is not a device index: give 0, 1, …, as 0=10GiB")
        })?;
        let bytes = parse_bytes(size)?;
        if limits.insert(device, bytes).is_some() {
            return Err(format!(
                "device {device} is limited twice: give one limit each"
            ));
        }
    }
    if limits.is_empty() {
        return Err(format!(
            "`{text}` limits no device: give an index and a size each, as 0=10GiB,1=8GiB"
        ));
    }
    Ok(limits)
}

/// The most memory a device may be said to have (1 EiB).
const MOST_BYTES: f64 = (1u64 << 60) as f64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_both_units() {
        assert_eq!(parse_bytes("80GiB"), Ok(80 * GIB));
        assert_eq!(parse_bytes("141 GB"), Ok(141_000_000_000));
        assert_eq!(parse_bytes("1.5KiB"), Ok(1536));
        assert_eq!(parse_bytes("42"), Ok(42));
        assert!(parse_bytes("80 GiBs").unwrap_err().contains("not a unit"));
        assert!(parse_bytes("lots").unwrap_err().contains("not a size"));
    }

    #[test]
    fn limits_read_as_accelerate_names_them() {
        let limits = parse_limits("0=10GiB, 1=8GiB").unwrap();
        assert_eq!(
            limits.into_iter().collect::<Vec<_>>(),
            [(0, 10 * GIB), (1, 8 * GIB)]
        );
        assert!(parse_limits("10GiB").unwrap_err().contains("0=10GiB"));
        assert!(
            parse_limits("a=1GiB")
                .unwrap_err()
                .contains("not a device index")
        );
        assert!(
            parse_limits("0=1GiB,0=2GiB")
                .unwrap_err()
                .contains("limited twice")
        );
        assert!(parse_limits("0=lots").unwrap_err().contains("not a size"));
        assert!(parse_limits(",").unwrap_err().contains("limits no device"));
    }

    #[test]
    fn a_preset_makes_a_cluster() {
        let h100 = Preset::named("h100-sxm").unwrap().cluster(64, 8, 0.5);
        assert_eq!(h100.memory, 80 * GIB);
        assert!((h100.flops() - 494.5e12).abs() < 1e9);
        assert!(Preset::named("tpu").is_none());
    }
}
