//! Pipeline schedules: the order in which each stage runs the forwards and backwards of the
//! micro-batches of one flush (torch.distributed.pipelining's `ScheduleGPipe` and
//! `Schedule1F1B`).
//!
//! Sends never block and receives wait for their message, so any order in which every stage
//! runs micro-batch `j`'s forward after the previous stage's and its backward after the next
//! stage's is free of deadlock; both schedules here are.

use crate::plan::Schedule;

/// One unit of a stage's work: the forward or the backward of a micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Forward of micro-batch `j`: its activations are held until its backward.
    Forward(usize),
    /// Backward of micro-batch `j`: its activations are released.
    Backward(usize),
}

impl Schedule {
    /// The actions of stage `stage` of `stages` over `micro_batches` micro-batches.
    pub fn actions(self, stage: usize, stages: usize, micro_batches: usize) -> Vec<Action> {
        let m = micro_batches;
        match self {
            Schedule::GPipe => (0..m)
                .map(Action::Forward)
                .chain((0..m).map(Action::Backward))
                .collect(),
            Schedule::OneFOneB => {
                let warm_up = (stages - 1 - stage).min(m);
                let mut actions = Vec::with_capacity(2 * m);
                actions.extend((0..warm_up).map(Action::Forward));
                for j in 0..m - warm_up {
                    actions.push(Action::Forward(warm_up + j));
                    actions.push(Action::Backward(j));
                }
                actions.extend((m - warm_up..m).map(Action::Backward));
                actions
            }
        }
    }
}

/// The most micro-batches whose activations are held at once by `actions`.
pub fn peak_live(actions: &[Action]) -> usize {
    let (mut live, mut peak) = (0usize, 0usize);
    for action in actions {
        match action {
            Action::Forward(_) => {
                live += 1;
                peak = peak.max(live);
            }
            Action::Backward(_) => live -= 1,
        }
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulates the stages in lock-step rounds: an action may run once its input exists
    /// (the previous stage's forward, the next stage's backward). Returns the rounds taken, or
    /// `None` on deadlock.
    fn simulate(schedule: Schedule, p: usize, m: usize) -> Option<usize> {
        let plans: Vec<Vec<Action>> = (0..p).map(|s| schedule.actions(s, p, m)).collect();
        let mut next = vec![0usize; p];
        let mut fwd_done = vec![vec![false; m]; p];
        let mut bwd_done = vec![vec![false; m]; p];
        let mut rounds = 0;
        while next.iter().zip(&plans).any(|(n, plan)| *n < plan.len()) {
            rounds += 1;
            let mut progressed = false;
            let snapshot = (fwd_done.clone(), bwd_done.clone());
            for s in 0..p {
                let Some(&action) = plans[s].get(next[s]) else {
                    continue;
                };
                let ready = match action {
                    Action::Forward(j) => s == 0 || snapshot.0[s - 1][j],
                    Action::Backward(j) => snapshot.0[s][j] && (s == p - 1 || snapshot.1[s + 1][j]),
                };
                if ready {
                    match action {
                        Action::Forward(j) => fwd_done[s][j] = true,
                        Action::Backward(j) => bwd_done[s][j] = true,
                    }
                    next[s] += 1;
                    progressed = true;
                }
            }
            if !progressed {
                return None;
            }
        }
        Some(rounds)
    }

    #[test]
    fn every_micro_batch_runs_forward_then_backward_once() {
        for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
            for (p, m) in [(1, 1), (2, 1), (2, 4), (3, 7), (4, 2), (4, 8)] {
                for s in 0..p {
                    let actions = schedule.actions(s, p, m);
                    assert_eq!(actions.len(), 2 * m);
                    for j in 0..m {
                        let f = actions.iter().position(|a| *a == Action::Forward(j));
                        let b = actions.iter().position(|a| *a == Action::Backward(j));
                        assert!(f.unwrap() < b.unwrap(), "{schedule} p{p} m{m} s{s}");
                    }
                }
                assert!(simulate(schedule, p, m).is_some(), "{schedule} deadlocks");
            }
        }
    }

    #[test]
    fn one_f_one_b_holds_at_most_p_micro_batches_and_gpipe_holds_all() {
        for (p, m) in [(2, 8), (3, 7), (4, 4), (4, 9)] {
            for s in 0..p {
                let one_f_one_b = peak_live(&Schedule::OneFOneB.actions(s, p, m));
                assert!(one_f_one_b <= p - s, "stage {s} of {p}: {one_f_one_b}");
                assert_eq!(peak_live(&Schedule::GPipe.actions(s, p, m)), m);
            }
        }
    }

    #[test]
    fn both_take_the_ideal_number_of_rounds() {
        // With one round per action, a flush of m micro-batches over p stages takes
        // 2(m + p − 1) rounds: the bubble is 2(p − 1) rounds of idle time per stage.
        for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
            for (p, m) in [(2, 2), (2, 8), (4, 4)] {
                assert_eq!(
                    simulate(schedule, p, m),
                    Some(2 * (m + p - 1)),
                    "{schedule}"
                );
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
            assert_eq!(schedule.to_string().parse::<Schedule>(), Ok(schedule));
        }
        assert!(
            "zb".parse::<Schedule>()
                .unwrap_err()
                .contains("gpipe or 1f1b")
        );
    }
}
