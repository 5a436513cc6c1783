//! The process's memory, as the system counts it.

/// The peak resident set of this process in bytes (`VmHWM` of `/proc/self/status`): every
/// rank thread of the process together, and file pages it has mapped. `None` where the system
/// does not say (not Linux).
pub fn peak_host_bytes() -> Option<u64> {
    status_kib("VmHWM:").map(|kib| kib * 1024)
}

fn status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()
}
