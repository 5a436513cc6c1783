//! `kiln launch`: start a job of several processes through Open MPI's `mpirun`, the way users
//! already launch, with each output line prefixed by its rank and a failed rank named.
//!
//! `mpirun` does the real work: it starts the processes (on other machines through ssh, as
//! its hostfile says), wires up MPI, and ends the whole job as soon as one process fails. This
//! command adds what a user then wants to read: which rank printed a line (from
//! `--tag-output`), and one last line naming the rank that failed, read from `mpirun`'s own
//! report. Plain `mpirun -n N kiln …` and `srun kiln …` work without it.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

/// Flags of `kiln launch`.
#[derive(clap::Args, Debug)]
pub struct LaunchArgs {
    /// Processes on each machine (one per GPU, or a few on a CPU).
    #[arg(long)]
    nproc_per_node: usize,
    /// Machines [default: 1, or those of --hostfile].
    #[arg(long)]
    nnodes: Option<usize>,
    /// Open MPI hostfile: one machine per line, `host slots=N` (mpirun reaches the others
    /// through ssh).
    #[arg(long)]
    hostfile: Option<PathBuf>,
    /// The `mpirun` to use [default: the one on PATH].
    #[arg(long, default_value = "mpirun")]
    mpirun: PathBuf,
    /// One more argument for mpirun, as is (repeatable), e.g. `--mpirun-arg=--mca
    /// --mpirun-arg=btl_tcp_if_include --mpirun-arg=eth0`.
    #[arg(long = "mpirun-arg", allow_hyphen_values = true)]
    mpirun_args: Vec<String>,
    /// The program every process runs, and its arguments (after `--`).
    #[arg(last = true, required = true, num_args = 1..)]
    program: Vec<String>,
}

/// Why a job could not be launched.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// No processes asked for.
    #[error("--nproc-per-node and --nnodes must be at least 1")]
    Zero,
    /// `mpirun` could not be started.
    #[error(
        "{mpirun} could not be started ({reason}); multi-process runs need Open MPI: \
         apt-get install openmpi-bin libopenmpi-dev, or pass --mpirun PATH"
    )]
    NoMpirun {
        /// The command tried.
        mpirun: String,
        /// The operating system's reason.
        reason: String,
    },
    /// A hostfile that cannot be read.
    #[error("--hostfile {path}: {reason}")]
    Hostfile {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

impl LaunchArgs {
    /// The machines: as named, or the hostfile's non-comment lines.
    fn nodes(&self) -> Result<usize, LaunchError> {
        if let Some(n) = self.nnodes {
            return Ok(n);
        }
        let Some(path) = &self.hostfile else {
            return Ok(1);
        };
        let text = std::fs::read_to_string(path).map_err(|e| LaunchError::Hostfile {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let hosts = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .count();
        if hosts == 0 {
            return Err(LaunchError::Hostfile {
                path: path.display().to_string(),
                reason: "names no machine".into(),
            });
        }
        Ok(hosts)
    }

    /// mpirun's arguments for this job.
    fn mpirun_command(&self, nodes: usize) -> Command {
        let mut cmd = Command::new(&self.mpirun);
        cmd.arg("-n")
            .arg((self.nproc_per_node * nodes).to_string())
            // N per machine, consecutive ranks on one machine (as Kiln's ranks expect).
            .arg("--map-by")
            .arg(format!("ppr:{}:node", self.nproc_per_node))
            // Kiln's ranks are threads with their own pools; mpirun must not pin a process
            // to one core, nor refuse more processes than it counts cores.
            .arg("--bind-to")
            .arg("none")
            .arg("--oversubscribe")
            .arg("--tag-output");
        if is_root() {
            cmd.arg("--allow-run-as-root");
        }
        if let Some(hostfile) = &self.hostfile {
            cmd.arg("--hostfile").arg(hostfile);
        }
        for var in ["RUST_LOG", "RUST_BACKTRACE", "NO_COLOR"] {
            if std::env::var_os(var).is_some() {
                cmd.arg("-x").arg(var);
            }
        }
        cmd.args(&self.mpirun_args).args(&self.program);
        cmd
    }
}

/// Whether this process runs as root (mpirun refuses root without a flag).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// A line of `--tag-output`, `[job,rank]<stdout>:text`: the rank and the text. mpirun tags
/// every write, so a line a program wrote in pieces carries the tag again inside: those go.
fn untag(line: &str) -> Option<(usize, String)> {
    let rest = line.strip_prefix('[')?;
    let (tag, rest) = rest.split_once(']')?;
    let rank = tag.split(',').nth(1)?.trim().parse().ok()?;
    let stream = ["<stdout>:", "<stderr>:"]
        .into_iter()
        .find(|s| rest.starts_with(s))?;
    let inner = format!("[{tag}]{stream}");
    let text = rest[stream.len()..].replace(&inner, "");
    Some((rank, text.strip_prefix(' ').unwrap_or(&text).to_string()))
}

/// What mpirun's own report says of the process that failed first: its rank and how.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    rank: usize,
    how: String,
}

/// Reads mpirun's report, line by line, for the first failed rank.
#[derive(Default)]
struct Report {
    rank: Option<usize>,
    failure: Option<Failure>,
}

impl Report {
    fn read(&mut self, line: &str) {
        if self.failure.is_some() {
            return;
        }
        let line = line.trim();
        // "mpirun noticed that process rank 1 with PID 0 on node x exited on signal 9 (Killed)."
        if let Some(rest) = line.split("process rank ").nth(1)
            && line.contains("exited on signal")
            && let Some(rank) = rest.split_whitespace().next().and_then(|r| r.parse().ok())
        {
            let signal = line.split("exited on ").nth(1).unwrap_or("a signal");
            self.failure = Some(Failure {
                rank,
                how: signal.trim_end_matches('.').to_string(),
            });
        }
        // "Process name: [[38105,1],1]" then "Exit code: 1"
        if let Some(name) = line.strip_prefix("Process name:") {
            self.rank = name
                .trim()
                .trim_end_matches(']')
                .rsplit(',')
                .next()
                .and_then(|r| r.parse().ok());
        }
        if let (Some(code), Some(rank)) = (line.strip_prefix("Exit code:"), self.rank) {
            self.failure = Some(Failure {
                rank,
                how: format!("exit code {}", code.trim()),
            });
        }
    }
}

/// Runs `kiln launch`, returning the exit code: 0 when every process succeeded, else
/// mpirun's (non-zero) after naming the failed rank.
///
/// # Errors
/// [`LaunchError`] when the job cannot be started.
pub fn run(args: LaunchArgs) -> Result<ExitCode, LaunchError> {
    let nodes = args.nodes()?;
    if args.nproc_per_node == 0 || nodes == 0 {
        return Err(LaunchError::Zero);
    }
    let mut cmd = args.mpirun_command(nodes);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| LaunchError::NoMpirun {
            mpirun: args.mpirun.display().to_string(),
            reason: e.to_string(),
        })?;
    forward_signals(child.id());
    let report = Arc::new(Mutex::new(Report::default()));
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn({
        let report = report.clone();
        move || relay(stdout, false, &report)
    });
    let err = std::thread::spawn({
        let report = report.clone();
        move || relay(stderr, true, &report)
    });
    let status = child.wait().map_err(|e| LaunchError::NoMpirun {
        mpirun: args.mpirun.display().to_string(),
        reason: e.to_string(),
    })?;
    let _ = (out.join(), err.join());
    if status.success() {
        return Ok(ExitCode::SUCCESS);
    }
    let signal = FORWARDED.load(Ordering::SeqCst);
    if signal != 0 {
        // Each process stopped after the same step and said so; the first saved the run.
        eprintln!("kiln launch: the job was stopped by signal {signal}");
        return Ok(ExitCode::from(u8::try_from(128 + signal).unwrap_or(1)));
    }
    let failure = report
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .failure
        .clone();
    match failure {
        Some(Failure { rank, how }) => {
            eprintln!(
                "kiln launch: process rank {rank} ended the job ({how}); its error above names \
                 the cause, and mpirun stopped the other processes"
            )
        }
        None => eprintln!("kiln launch: the job failed ({status})"),
    }
    let code = status.code().unwrap_or(1).clamp(1, 255);
    Ok(ExitCode::from(code as u8))
}

/// Copies `from` line by line to this process's stdout (or stderr), rank tags turned into
/// `[rank R] ` prefixes, reading mpirun's own lines for a failure.
fn relay(from: impl std::io::Read, to_stderr: bool, report: &Mutex<Report>) {
    for line in BufReader::new(from).lines() {
        let Ok(line) = line else { break };
        let text = match untag(&line) {
            Some((rank, text)) => format!("[rank {rank}] {text}"),
            None => {
                report.lock().unwrap_or_else(|p| p.into_inner()).read(&line);
                line
            }
        };
        // A closed terminal or pipe: keep draining so that mpirun never blocks on us.
        let _ = if to_stderr {
            writeln!(std::io::stderr(), "{text}")
        } else {
            writeln!(std::io::stdout(), "{text}")
        };
    }
}

/// Passes SIGINT and SIGTERM on to the job. The first becomes SIGUSR1, which mpirun forwards
/// to every process, and which Kiln's processes take as a request to stop after the same step
/// (the first saving the run); mpirun itself would end the job on SIGINT or SIGTERM before the
/// save. A second signal goes to mpirun as is, which then ends the job at once. Killing mpirun
/// instead would leave the processes behind.
fn forward_signals(pid: u32) {
    static CHILD: AtomicI32 = AtomicI32::new(0);
    CHILD.store(pid as i32, Ordering::SeqCst);
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // SAFETY: the handler only calls `kill` and touches atomics, all async-signal-safe.
        let _ = unsafe {
            signal_hook::low_level::register(signal, move || {
                let first = FORWARDED.swap(signal, Ordering::SeqCst) == 0;
                let pass = if first { libc::SIGUSR1 } else { signal };
                libc::kill(CHILD.load(Ordering::SeqCst), pass);
            })
        };
    }
}

/// The last signal passed on to mpirun (0: none).
static FORWARDED: AtomicI32 = AtomicI32::new(0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_become_rank_prefixes() {
        let some = |rank, text: &str| Some((rank, text.to_string()));
        assert_eq!(untag("[1,3]<stdout>:loss 0.5"), some(3, "loss 0.5"));
        assert_eq!(untag("[1,0]<stderr>: warn"), some(0, "warn"));
        assert_eq!(
            untag("[1,1]<stderr>:error: [1,1]<stderr>:3[1,1]<stderr>: ranks"),
            some(1, "error: 3 ranks")
        );
        assert_eq!(untag("plain line"), None);
        assert_eq!(untag("[x]<stdout>:"), None);
    }

    #[test]
    fn mpiruns_report_names_the_failed_rank() {
        let mut exited = Report::default();
        for line in [
            "Primary job  terminated normally, but 1 process returned",
            "  Process name: [[38105,1],1]",
            "  Exit code:    3",
        ] {
            exited.read(line);
        }
        assert_eq!(
            exited.failure,
            Some(Failure {
                rank: 1,
                how: "exit code 3".into()
            })
        );
        let mut killed = Report::default();
        killed.read(
            "mpirun noticed that process rank 0 with PID 0 on node a exited on signal 9 (Killed).",
        );
        assert_eq!(
            killed.failure,
            Some(Failure {
                rank: 0,
                how: "signal 9 (Killed)".into()
            })
        );
    }

    #[test]
    fn one_machine_by_default_and_the_hostfiles_otherwise() {
        let dir = std::env::temp_dir().join(format!("kiln-hostfile-{}", std::process::id()));
        std::fs::write(
            &dir,
            "# two machines\nnode-a slots=2\n\nnode-b slots=2 # b\n",
        )
        .unwrap();
        let args = |hostfile: Option<PathBuf>| LaunchArgs {
            nproc_per_node: 2,
            nnodes: None,
            hostfile,
            mpirun: "mpirun".into(),
            mpirun_args: Vec::new(),
            program: vec!["kiln".into()],
        };
        assert_eq!(args(None).nodes().unwrap(), 1);
        assert_eq!(args(Some(dir.clone())).nodes().unwrap(), 2);
        std::fs::remove_file(&dir).unwrap();
    }
}
