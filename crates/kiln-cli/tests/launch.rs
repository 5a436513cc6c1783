//! `kiln launch` end to end, on this machine's loopback: Ddp, Pipeline and Tensor across
//! processes (and processes of several ranks, and two "machines" of a hostfile) train exactly
//! as one device does, the AD job writes its run once, and the faults a user meets end the job
//! with a clear error and no process left. Needs Open MPI (`.ci/run` installs it) and the `mpi` feature.
#![cfg(feature = "mpi")]

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{finetune_args, kiln, scratch};

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// mpirun's arguments that give one job a session directory of its own. Open MPI keeps every
/// job's files under `<tmpdir>/ompi.<host>.<uid>`, and a job that ends may remove that
/// directory while another test's job is still starting in it: CI once saw a daemon fail with
/// "mkdir was unable to create /tmp/ompi.vm.0/jf.3329/0/1: No such file or directory".
fn own_session() -> [String; 3] {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ompi-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    [
        "--mpirun-arg=--mca".to_string(),
        "--mpirun-arg=orte_tmpdir_base".to_string(),
        format!("--mpirun-arg={}", dir.display()),
    ]
}

/// `kiln launch <launch> -- kiln <args>`, in a session directory of its own.
fn launch(launch: &[&str], args: &[&str]) -> Output {
    let session = own_session();
    let mut all = vec!["launch"];
    all.extend(session.iter().map(String::as_str));
    all.extend_from_slice(launch);
    all.push("--");
    all.push(KILN);
    all.extend_from_slice(args);
    kiln(&all)
}

fn report(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Trains with `args` plus `--json`, through `kiln launch` with `launch` when given.
fn train(dir: &Path, name: &str, launch_args: Option<&[&str]>, args: &[&str]) -> serde_json::Value {
    let json = dir.join(format!("{name}.json"));
    let mut all = vec!["train", "--json", json.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = match launch_args {
        Some(l) => launch(l, &all),
        None => kiln(&all),
    };
    assert!(out.status.success(), "{name}: {}", text(&out));
    report(&json)
}

fn assert_same_training(a: &serde_json::Value, b: &serde_json::Value, what: &str) {
    for key in ["param_sum", "param_sq_sum", "final_loss"] {
        let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
        let scale = x.abs().max(y.abs()).max(1e-12);
        assert!((x - y).abs() / scale < 1e-5, "{what}: {key} {x} vs {y}");
    }
}

#[test]
fn ddp_across_processes_trains_as_one_device() {
    let dir = scratch("ddp");
    let two = ["--nproc-per-node", "2"];
    for model in ["mlp", "transformer"] {
        let common = ["--model", model, "--steps", "4", "--batch", "66"];
        let with = |extra: &[&'static str]| -> Vec<&str> {
            common
                .iter()
                .copied()
                .chain(extra.iter().copied())
                .collect()
        };
        let single = train(&dir, "single", None, &with(&["--strategy", "single"]));
        // 2 processes of one rank, then of two ranks each (66 samples over 4 replicas: 17, 17,
        // 16, 16).
        let procs = train(&dir, "procs", Some(&two), &with(&["--strategy", "ddp"]));
        let ranks = ["--strategy", "ddp", "--world", "4"];
        let threads = train(&dir, "threads", Some(&two), &with(&ranks));
        assert_eq!(procs["world"], 2);
        assert_eq!(threads["world"], 4);
        let samples: Vec<u64> = threads["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["samples"].as_u64().unwrap())
            .collect();
        assert_eq!(
            samples,
            [68, 68, 64, 64],
            "every rank's totals, from both processes"
        );
        assert_same_training(&single, &procs, &format!("{model}: 2 processes"));
        assert_same_training(
            &single,
            &threads,
            &format!("{model}: 2 processes × 2 ranks"),
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn auto_across_processes_plans_once_with_the_first_s_measurement() {
    // The default strategy: the first process measures the model, every process plans the same
    // layout from it (processes that chose apart would not form one world), and it trains as
    // one device does.
    let dir = scratch("auto");
    let two = ["--nproc-per-node", "2"];
    let common = ["--model", "transformer", "--steps", "3", "--batch", "32"];
    let single = train(
        &dir,
        "single",
        None,
        &[&common[..], &["--strategy", "single"]].concat(),
    );
    let planned = train(&dir, "auto", Some(&two), &common);
    let reason = planned["strategy_reason"].as_str().unwrap();
    assert!(
        reason.contains("ms a step predicted") && !reason.contains("no model was described"),
        "{reason}"
    );
    assert_eq!(planned["world"], 2);
    assert_same_training(&single, &planned, "auto over 2 processes");
    // Stages fixed by the user: the pipeline's stages in the two processes.
    let staged = train(
        &dir,
        "staged",
        Some(&two),
        &[&common[..], &["--stages", "2"]].concat(),
    );
    assert_eq!(staged["strategy"], "pipeline", "{staged}");
    assert_same_training(&single, &staged, "auto with 2 stages over 2 processes");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pipeline_stages_in_different_processes_train_as_one_device() {
    let dir = scratch("pipeline");
    let two = ["--nproc-per-node", "2"];
    let joined = |extra: &[&str]| -> Vec<String> {
        ["--model", "transformer", "--steps", "4", "--batch", "32"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    let run = |name: &str, launch: Option<&[&str]>, extra: &[&str]| {
        let args = joined(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        train(&dir, name, launch, &args)
    };
    let single = run("single", None, &["--strategy", "single"]);
    // Stage 0 in the first process, stage 1 in the second: activations and gradients cross
    // processes, and the model and optimizer state are gathered for the report and the save.
    let save = dir.join("save");
    let staged = [
        "--strategy",
        "pipeline",
        "--stages",
        "2",
        "--save",
        save.to_str().unwrap(),
    ];
    let stages = run("stages", Some(&two), &staged);
    assert!(
        save.join("step-00000004").is_dir(),
        "the first process saved"
    );
    // dp × pp = 2 × 2 over 2 processes of 2 ranks: each process one replica's two stages.
    let grid = ["--strategy", "pipeline", "--stages", "2", "--world", "4"];
    let grid = run("grid", Some(&two), &grid);
    assert_eq!(
        (stages["world"].as_u64(), grid["world"].as_u64()),
        (Some(2), Some(4))
    );
    assert_same_training(&single, &stages, "2 stages in 2 processes");
    assert_same_training(&single, &grid, "dp 2 × pp 2 over 2 processes");
    // The checkpoint the processes wrote together resumes, across processes, bit for bit.
    let six = |resume: Option<&Path>| {
        let mut args = vec!["--model", "transformer", "--batch", "32", "--steps", "6"];
        args.extend(["--strategy", "pipeline", "--stages", "2"]);
        if let Some(save) = resume {
            args.extend(["--resume", save.to_str().unwrap()]);
        }
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let (straight, resumed) = (six(None), six(Some(&save)));
    let straight: Vec<&str> = straight.iter().map(String::as_str).collect();
    let resumed: Vec<&str> = resumed.iter().map(String::as_str).collect();
    let straight = train(&dir, "straight", None, &straight);
    let resumed = train(&dir, "resumed", Some(&two), &resumed);
    for key in ["param_sum", "param_sq_sum", "final_loss"] {
        assert_eq!(straight[key], resumed[key], "{key}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn split_optimizer_state_across_processes_trains_as_plain_ddp_and_resumes_bit_for_bit() {
    let dir = scratch("zero1");
    let two = ["--nproc-per-node", "2"];
    let save = dir.join("save");
    let args_of = |world: &'static str, steps: &'static str, extra: &[&str]| -> Vec<String> {
        let common = ["--model", "transformer", "--batch", "30", "--world", world];
        let ddp = ["--strategy", "ddp", "--steps", steps];
        common
            .iter()
            .chain(&ddp)
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    let args = |steps, extra: &[&str]| args_of("4", steps, extra);
    let run = |name: &str, launch: Option<&[&str]>, args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        train(&dir, name, launch, &args)
    };
    let split = ["--shard-state", "optimizer"];
    let plain = run("plain", Some(&two), args("4", &[]));
    let saved = [&split[..], &["--save", save.to_str().unwrap()]].concat();
    let zero = run("zero", Some(&two), args("4", &saved));
    // The owners step what every replica of plain ddp steps: the same bits.
    for key in ["param_sum", "param_sq_sum", "final_loss"] {
        assert_eq!(plain[key], zero[key], "{key}");
    }
    // Each rank's `key` in a run's report.
    let per_rank = |report: &serde_json::Value, key: &str| -> Vec<u64> {
        let ranks = report["ranks"].as_array().unwrap();
        ranks.iter().map(|r| r[key].as_u64().unwrap()).collect()
    };
    let bytes = |report: &serde_json::Value| per_rank(report, "optimizer_bytes");
    let (whole, parts) = (bytes(&plain), bytes(&zero));
    assert_eq!(
        parts.iter().sum::<u64>(),
        whole[0],
        "{parts:?} against {whole:?}"
    );
    assert!(
        parts.iter().all(|&p| p < whole[0] / 2),
        "{parts:?} against {whole:?}"
    );
    // ZeRO-2 across the processes: each owner receives its parameters' sums alone, and trains
    // as plain ddp (no clipping here: the same sums, the same bits).
    let zero2 = run(
        "zero2",
        Some(&two),
        args("4", &["--shard-state", "gradients"]),
    );
    for key in ["param_sum", "param_sq_sum", "final_loss"] {
        assert_eq!(plain[key], zero2[key], "ZeRO-2: {key}");
    }
    let (whole, parts) = (
        per_rank(&plain, "grad_bytes"),
        per_rank(&zero2, "grad_bytes"),
    );
    assert_eq!(
        parts.iter().sum::<u64>(),
        whole[0],
        "{parts:?} against {whole:?}"
    );
    assert_eq!(
        bytes(&zero2),
        bytes(&zero),
        "ZeRO-2 splits the optimizer state as ZeRO-1"
    );
    // ZeRO-3 across the processes: each replica gathers the others' parameters from their
    // owners, in its own process or the other, before each forward, and the model the report
    // reads is gathered by every rank of both processes.
    let zero3 = run(
        "zero3",
        Some(&two),
        args("4", &["--shard-state", "parameters"]),
    );
    for key in ["param_sum", "param_sq_sum", "final_loss"] {
        assert_eq!(plain[key], zero3[key], "ZeRO-3: {key}");
    }
    let (whole, parts) = (
        per_rank(&plain, "param_bytes"),
        per_rank(&zero3, "param_bytes"),
    );
    assert_eq!(
        parts.iter().sum::<u64>(),
        whole[0],
        "ZeRO-3 parameters held between steps: {parts:?} against {whole:?}"
    );
    // In bf16 the owners send the others the bf16 copies their forwards read, across the
    // processes, and keep the f32 master weights alone: plain ddp's bits, and less held.
    let bf16 = ["--precision", "bf16"];
    let plain_bf16 = run("plain-bf16", Some(&two), args("4", &bf16));
    let zero2_bf16 = run(
        "zero2-bf16",
        Some(&two),
        args("4", &[&bf16[..], &["--shard-state", "gradients"]].concat()),
    );
    for key in ["param_sum", "param_sq_sum", "final_loss"] {
        assert_eq!(plain_bf16[key], zero2_bf16[key], "bf16 ZeRO-2: {key}");
    }
    let (whole, parts) = (
        per_rank(&plain_bf16, "param_bytes"),
        per_rank(&zero2_bf16, "param_bytes"),
    );
    assert!(
        parts.iter().all(|&p| p < whole[0] * 3 / 4),
        "bf16 ZeRO-2 parameters held between steps: {parts:?} against {whole:?}"
    );
    // The parts, gathered from both processes into one checkpoint, resume across processes
    // (against processes too: MPI's sums need not round as the in-process collective's).
    // Three processes of one rank each: three owners, one a process.
    let three = ["--nproc-per-node", "3"];
    let plain3 = run("plain3", Some(&three), args_of("3", "4", &[]));
    let split3 = run("split3", Some(&three), args_of("3", "4", &split));
    for key in ["param_sum", "param_sq_sum", "final_loss"] {
        assert_eq!(plain3[key], split3[key], "3 processes: {key}");
    }
    let (whole3, parts3) = (bytes(&plain3), bytes(&split3));
    assert_eq!(parts3.len(), 3);
    assert_eq!(parts3.iter().sum::<u64>(), whole3[0], "{parts3:?}");
    let straight = run("straight", Some(&two), args("6", &split));
    let resume = [&split[..], &["--resume", save.to_str().unwrap()]].concat();
    let resumed = run("resumed", Some(&two), args("6", &resume));
    for key in ["param_sum", "param_sq_sum", "final_loss"] {
        assert_eq!(straight[key], resumed[key], "{key}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tensor_shards_in_different_processes_train_as_one_device() {
    let dir = scratch("tensor");
    let two = ["--nproc-per-node", "2"];
    let run = |name: &str, launch: Option<&[&str]>, extra: &[&str]| {
        let args: Vec<&str> = ["--model", "transformer", "--batch", "32"]
            .iter()
            .chain(extra)
            .copied()
            .collect();
        train(&dir, name, launch, &args)
    };
    let single = run("single", None, &["--strategy", "single", "--steps", "4"]);
    // Shard 0 in the first process, shard 1 in the second: every sharded layer's all-reduce and
    // all-gather crosses processes, inside the forward and the backward.
    let save = dir.join("save");
    let across = [
        "--strategy",
        "tensor",
        "--tp",
        "2",
        "--steps",
        "4",
        "--save",
        save.to_str().unwrap(),
    ];
    let across = run("across", Some(&two), &across);
    // 2 processes of 2 ranks: the shards meet in a process, the replicas (or the stages)
    // across processes.
    let replicas = [
        "--strategy",
        "tensor",
        "--tp",
        "2",
        "--dp",
        "2",
        "--world",
        "4",
    ];
    let replicas = run(
        "replicas",
        Some(&two),
        &[&replicas[..], &["--steps", "4"]].concat(),
    );
    let stages = [
        "--strategy",
        "tensor",
        "--tp",
        "2",
        "--stages",
        "2",
        "--micro-batches",
        "2",
        "--world",
        "4",
        "--steps",
        "4",
    ];
    let stages = run("stages", Some(&two), &stages);
    for (report, mesh) in [
        (&across, "dp=1 × tp=2"),
        (&replicas, "dp=2 × tp=2"),
        (&stages, "dp=1 × pp=2 × tp=2"),
    ] {
        assert_eq!(report["mesh"], mesh);
        assert_same_training(&single, report, mesh);
        for rank in report["ranks"].as_array().unwrap() {
            assert!(rank["tp_calls"].as_u64().unwrap() > 0, "{mesh}: {rank}");
        }
    }
    // The shards and their optimizer states, gathered from both processes into one checkpoint,
    // resume across processes bit for bit.
    let six = |name: &str, resume: Option<&Path>| {
        let mut args = vec!["--strategy", "tensor", "--tp", "2", "--steps", "6"];
        if let Some(save) = resume {
            args.extend(["--resume", save.to_str().unwrap()]);
        }
        run(name, Some(&two), &args)
    };
    let (straight, resumed) = (six("straight", None), six("resumed", Some(&save)));
    for key in ["param_sum", "param_sq_sum", "final_loss"] {
        assert_eq!(straight[key], resumed[key], "{key}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_machines_of_a_hostfile_run_the_same_job() {
    // Two "machines" that are both this one: mpirun reaches each through an ssh that runs the
    // command here.
    let dir = scratch("hostfile");
    let ssh = dir.join("ssh");
    std::fs::write(
        &ssh,
        "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in -*) shift;; *) break;; esac; done\n\
         shift\nexec sh -c \"$*\"\n",
    )
    .unwrap();
    let chmod = Command::new("chmod").arg("+x").arg(&ssh).status().unwrap();
    assert!(chmod.success());
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, "machine-a slots=2\nmachine-b slots=2\n").unwrap();
    let agent = format!("--mpirun-arg={}", ssh.display());
    let launch_args = [
        "--nproc-per-node",
        "1",
        "--hostfile",
        hosts.to_str().unwrap(),
        "--mpirun-arg=--mca",
        "--mpirun-arg=plm_rsh_agent",
        agent.as_str(),
        // Two daemons of one job on one machine: sharing hwloc's topology through a mapping
        // at the "biggest hole" of the address space crashed a daemon on CI (a segfault in
        // `hwloc_shmem_topology_write`, at a stack address). Real machines each have one
        // daemon; the sharing is only an optimisation, so the test turns it off.
        "--mpirun-arg=--mca",
        "--mpirun-arg=rtc_hwloc_vmhole",
        "--mpirun-arg=none",
    ];
    let args = ["--strategy", "ddp", "--steps", "3"];
    let nodes = train(&dir, "nodes", Some(&launch_args), &args);
    let single = train(
        &dir,
        "single",
        None,
        &["--strategy", "single", "--steps", "3"],
    );
    assert_eq!(nodes["world"], 2);
    assert_same_training(&single, &nodes, "two machines");
    std::fs::remove_dir_all(&dir).unwrap();
}

const TINY_AD: &str = "seed = 3\n[env]\nsize = 5\nhorizon = 8\n[goals]\nheld_out = 2\n\
    [source]\nhistories_per_goal = 2\nepisodes = 6\n[model]\ncontext = 16\nd_model = 16\n\
    d_ff = 32\n[train]\nsteps = 4\nwarmup_steps = 1\nbatch = 6\n[eval]\nepisodes = 3\n\
    seeds = 2\n";

#[test]
fn ad_train_under_launch_writes_one_run() {
    let dir = scratch("ad");
    let config = dir.join("tiny.toml");
    std::fs::write(&config, TINY_AD).unwrap();
    let config = config.to_str().unwrap();
    let (launched, threads) = (dir.join("launched"), dir.join("threads"));
    let args = |out: &Path| {
        let out = out.to_str().unwrap().to_string();
        vec![
            "ad",
            "train",
            "--config",
            config,
            "--strategy",
            "ddp",
            "--out",
        ]
        .into_iter()
        .map(String::from)
        .chain([out])
        .collect::<Vec<_>>()
    };
    let launched_args = args(&launched);
    let refs: Vec<&str> = launched_args.iter().map(String::as_str).collect();
    let out = launch(&["--nproc-per-node", "2"], &refs);
    assert!(out.status.success(), "{}", text(&out));
    // Written once: one "wrote" line, from rank 0.
    let wrote: Vec<&str> = std::str::from_utf8(&out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.contains("wrote"))
        .collect();
    assert_eq!(wrote.len(), 1, "{}", text(&out));
    assert!(wrote[0].starts_with("[rank 0]"), "{}", wrote[0]);
    for file in ["metrics.json", "returns.svg", "config.toml", "checkpoints"] {
        assert!(launched.join(file).exists(), "{file}");
    }
    let mut in_process = args(&threads);
    in_process.extend(["--world".into(), "2".into()]);
    let refs: Vec<&str> = in_process.iter().map(String::as_str).collect();
    let out = kiln(&refs);
    assert!(out.status.success(), "{}", text(&out));
    let curve = |d: &Path| report(&d.join("metrics.json"))["train"]["loss_curve"].clone();
    let (a, b) = (curve(&launched), curve(&threads));
    let (a, b) = (a.as_array().unwrap(), b.as_array().unwrap());
    assert_eq!(a.len(), 4);
    for (x, y) in a.iter().zip(b) {
        // (step, loss) pairs.
        let (x, y) = (x[1].as_f64().unwrap(), y[1].as_f64().unwrap());
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1e-12), "{x} vs {y}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Stages of 2 + 1 blocks in two processes (a three-block AD model) train as one device does:
/// the boundaries are read the same in every process.
#[test]
fn uneven_stages_in_different_processes_train_as_one_device() {
    let dir = scratch("ad-uneven");
    let config = dir.join("tiny.toml");
    std::fs::write(
        &config,
        TINY_AD.replace("[model]\n", "[model]\nlayers = 3\n"),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let run = |name: &str, launched: bool, strategy: &[&str]| {
        let out_dir = dir.join(name);
        let out_s = out_dir.to_str().unwrap();
        let args = [
            &["ad", "train", "--config", config, "--out", out_s][..],
            strategy,
        ]
        .concat();
        let out = match launched {
            true => launch(&["--nproc-per-node", "2"], &args),
            false => kiln(&args),
        };
        assert!(out.status.success(), "{}", text(&out));
        report(&out_dir.join("metrics.json"))["train"].clone()
    };
    let single = run("single", false, &["--strategy", "single"]);
    let staged = run(
        "staged",
        true,
        &[
            "--strategy",
            "pipeline",
            "--stage-blocks",
            "2,1",
            "--micro-batches",
            "2",
        ],
    );
    assert_eq!(staged["world"], 2, "{staged}");
    let curve = |t: &serde_json::Value| t["loss_curve"].as_array().unwrap().clone();
    assert_eq!(curve(&single).len(), 4);
    for (x, y) in curve(&single).iter().zip(curve(&staged).iter()) {
        let (x, y) = (x[1].as_f64().unwrap(), y[1].as_f64().unwrap());
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1e-12), "{x} vs {y}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ad_train_under_launch_plans_with_the_first_process_s_measurement() {
    // `auto`, the default: once the histories exist, the first process measures the AD
    // transformer and both processes train the layout it planned, as two ranks in one
    // process do.
    let dir = scratch("ad-auto");
    let config = dir.join("tiny.toml");
    std::fs::write(&config, TINY_AD).unwrap();
    let config = config.to_str().unwrap();
    let (launched, threads) = (dir.join("launched"), dir.join("threads"));
    let (launched_s, threads_s) = (launched.to_str().unwrap(), threads.to_str().unwrap());
    let out = launch(
        &["--nproc-per-node", "2"],
        &["ad", "train", "--config", config, "--out", launched_s],
    );
    assert!(out.status.success(), "{}", text(&out));
    let train = report(&launched.join("metrics.json"))["train"].clone();
    let reason = train["strategy_reason"].as_str().unwrap();
    assert!(
        reason.contains("ms a step predicted") && !reason.contains("no model was described"),
        "{reason}"
    );
    let args = ["ad", "train", "--config", config, "--out", threads_s];
    let out = kiln(&[&args[..], &["--world", "2"]].concat());
    assert!(out.status.success(), "{}", text(&out));
    let in_process = report(&threads.join("metrics.json"))["train"].clone();
    // Both planned from a measurement, each of its own: the layout is the cost model's, and
    // the losses are single-device training's either way.
    let curve = |t: &serde_json::Value| t["loss_curve"].as_array().unwrap().clone();
    for (x, y) in curve(&train).iter().zip(curve(&in_process).iter()) {
        let (x, y) = (x[1].as_f64().unwrap(), y[1].as_f64().unwrap());
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1e-12), "{x} vs {y}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn finetune_across_processes_writes_the_adapters_of_one_process() {
    let dir = scratch("finetune");
    // The fixture run of the fine-tuning tests, through Ddp, evaluated after step 2 and at
    // the end (gathering the model for it is a collective every process joins).
    let chat = common::fixture("chat.jsonl");
    let args = |out: &Path| {
        let eval = ["--eval-data", &chat, "--eval-every", "2"];
        finetune_args(out, "3", &[&["--strategy", "ddp"][..], &eval].concat())
    };
    let (processes, threads) = (dir.join("processes"), dir.join("threads"));
    let launched = args(&processes);
    let refs: Vec<&str> = launched.iter().map(String::as_str).collect();
    let out = launch(&["--nproc-per-node", "2"], &refs);
    assert!(out.status.success(), "{}", text(&out));
    let mut in_process = args(&threads);
    in_process.extend(["--world".into(), "2".into()]);
    let refs: Vec<&str> = in_process.iter().map(String::as_str).collect();
    let out = kiln(&refs);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(report(&processes.join("run.json"))["world"], 2);
    // The same adapters, bit for bit: two replicas sum alike in MPI and in one process.
    let weights = |d: &Path| std::fs::read(d.join("adapters/adapter_model.safetensors")).unwrap();
    assert_eq!(weights(&processes), weights(&threads));
    let evals = |d: &Path| report(&d.join("run.json"))["evals"].clone();
    assert_eq!(evals(&processes).as_array().map(Vec::len), Some(2));
    assert_eq!(evals(&processes), evals(&threads));
    // ZeRO-3 with the layers recomputed: each layer gathered from the owners in both
    // processes as it runs, and the model gathered for the evaluations. The same training.
    let by_layer = dir.join("by-layer");
    let mut launched = args(&by_layer);
    launched.extend(["--shard-state", "parameters", "--gradient-checkpointing"].map(String::from));
    let refs: Vec<&str> = launched.iter().map(String::as_str).collect();
    let out = launch(&["--nproc-per-node", "2"], &refs);
    assert!(out.status.success(), "{}", text(&out));
    let losses = |d: &Path| report(&d.join("run.json"))["losses"].clone();
    let (a, b) = (losses(&threads), losses(&by_layer));
    for (x, y) in a.as_array().unwrap().iter().zip(b.as_array().unwrap()) {
        let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
        assert!((x - y).abs() <= 1e-5 * x.abs(), "by layer: {x} vs {y}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A long run under `kiln launch` whose processes write their pid to `dir/<rank>`, with more
/// `flags`; the launcher's child and the time it started.
fn long_run(dir: &Path, flags: &str) -> (std::process::Child, Instant) {
    let config = format!(" {flags}");
    let script = format!(
        "echo $$ > {}/$OMPI_COMM_WORLD_RANK; exec {KILN} train --model transformer --strategy \
         ddp --steps 1000000{config}",
        dir.display()
    );
    let child = Command::new(KILN)
        .arg("launch")
        .args(own_session())
        .args(["--nproc-per-node", "2", "--", "sh", "-c", &script])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, Instant::now())
}

/// Waits until both processes have started training (wrote their pid, then 2 s more).
fn pid_of(dir: &Path, rank: usize) -> String {
    let path = dir.join(rank.to_string());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() || !dir.join("0").exists() {
        assert!(Instant::now() < deadline, "the processes did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

/// Whether a process of the job in `dir` is still alive three seconds after the job ended: a
/// killed process dies a moment after its launcher returns, under load a little later.
fn any_left(dir: &Path) -> bool {
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        if !alive(dir) {
            return false;
        }
        if Instant::now() >= until {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether any of the job's processes (by the pids in `dir`) is alive: a zombie, dead but not
/// yet reaped by a container's init, is not.
fn alive(dir: &Path) -> bool {
    ["0", "1"].iter().any(|r| {
        let pid = std::fs::read_to_string(dir.join(r)).unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()));
        // `pid (comm) state …`: the state follows the last ')'.
        stat.is_ok_and(|s| {
            let state = s.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
    })
}

#[test]
fn a_killed_process_ends_the_job_naming_its_rank() {
    let dir = scratch("kill");
    let (child, _) = long_run(&dir, "");
    let pid = pid_of(&dir, 1);
    let killed = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-9", &pid])
            .status()
            .unwrap()
            .success()
    );
    let out = child.wait_with_output().unwrap();
    let took = killed.elapsed();
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        took < Duration::from_secs(10),
        "the job took {took:?} to end"
    );
    assert!(
        said.contains("process rank 1 ended the job (signal 9"),
        "{said}"
    );
    assert!(!any_left(&dir), "a process of the job is left");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_stopped_process_is_named_by_the_others_timeout() {
    let dir = scratch("stop");
    let config = dir.join("timeout.toml");
    std::fs::write(&config, "[parallel.ddp]\ncollective_timeout_s = 3.0\n").unwrap();
    let (child, _) = long_run(&dir, &format!("--config {}", config.display()));
    let pid = pid_of(&dir, 1);
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let stopped = Instant::now();
    let out = child.wait_with_output().unwrap();
    let took = stopped.elapsed();
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        took < Duration::from_secs(20),
        "the job took {took:?} to end"
    );
    assert!(
        said.contains("timed out after 3s: rank(s) [1] never arrived"),
        "{said}"
    );
    assert!(!any_left(&dir), "a process of the job is left");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_signal_stops_every_process_after_the_same_step_and_the_first_saves() {
    let dir = scratch("signal");
    let save = dir.join("save");
    // Periodic saves too: every process keeps the schedule, the first writes.
    let (child, _) = long_run(&dir, &format!("--save {} --save-every 50", save.display()));
    pid_of(&dir, 1);
    let launcher = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &launcher])
            .status()
            .unwrap()
            .success()
    );
    let out = child.wait_with_output().unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(143), "{said}");
    let step = |rank: usize| -> usize {
        let prefix = format!("[rank {rank}] stopped by the launcher (SIGUSR1) after step ");
        let line = said.lines().find(|l| l.starts_with(&prefix));
        let rest = &line.unwrap_or_else(|| panic!("rank {rank} stopped:\n{said}"))[prefix.len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    let (first, second) = (step(0), step(1));
    assert_eq!(first, second, "{said}");
    assert!(save.join(format!("step-{first:08}")).is_dir(), "{said}");
    assert!(said.contains("its first process saves"), "{said}");
    assert!(!any_left(&dir), "a process of the job is left");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn processes_that_disagree_are_refused_at_start_up() {
    let lr = format!(
        "exec {KILN} train --strategy ddp --steps 3 --lr 0.00$((OMPI_COMM_WORLD_RANK + 1))"
    );
    let out = kiln(&["launch", "--nproc-per-node", "2", "--", "sh", "-c", &lr]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("[rank 1] error:") && said.contains("config's lr differs from rank 0's"),
        "{said}"
    );
    let world = format!(
        "exec {KILN} train --strategy ddp --steps 3 --world $((2 + 2 * OMPI_COMM_WORLD_RANK))"
    );
    let out = kiln(&["launch", "--nproc-per-node", "2", "--", "sh", "-c", &world]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("sees another world than this one"), "{said}");
    // A process that plans with `auto` beside one that does not: both fail, in one line.
    let strategies = format!(
        "exec {KILN} train --steps 3 --strategy $([ $OMPI_COMM_WORLD_RANK = 0 ] && echo auto \
         || echo ddp)"
    );
    let out = kiln(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--",
        "sh",
        "-c",
        &strategies,
    ]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("process 1 is not planning with auto"),
        "{said}"
    );
    // A strategy that cannot span processes says so in one line per process.
    let out = launch(
        &["--nproc-per-node", "2"],
        &["train", "--strategy", "single"],
    );
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("but single cannot"), "{said}");
}
