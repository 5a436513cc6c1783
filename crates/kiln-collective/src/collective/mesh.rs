//! One rank's collectives on a [`Mesh`]: a group for the whole world and one along each axis.

use std::time::Duration;

use burn::tensor::backend::Backend;

use super::{Collective, CollectiveCounters, InProcess};
use crate::world::{Mesh, MeshError};

/// A rank's handles on the world and on its group along every axis of the mesh, e.g. the
/// other stages of its replica (`pp`) and the other replicas of its stage (`dp`).
///
/// The groups are independent: a failure poisons the groups of the rank that failed, and its
/// peers, failing in turn, poison theirs, so every rank is released. A worker that fails must
/// call [`MeshCollectives::abort`] (dropping the handles does the same).
pub struct MeshCollectives<B: Backend> {
    rank: usize,
    world: Box<dyn Collective<B>>,
    axes: Vec<(String, Box<dyn Collective<B>>)>,
}

impl<B: Backend> MeshCollectives<B> {
    /// In-process groups for every rank of `mesh`, in rank order; calls time out after
    /// `timeout`. Hand element `r` to the thread of rank `r`.
    pub fn in_process(mesh: &Mesh, timeout: Duration) -> Vec<Self> {
        let size = mesh.size();
        let mut ranks: Vec<Self> = InProcess::group(size, timeout)
            .into_iter()
            .enumerate()
            .map(|(rank, world)| Self {
                rank,
                world: Box::new(world),
                axes: Vec::with_capacity(mesh.axes().len()),
            })
            .collect();
        for axis in mesh.axes() {
            for (rank, handle) in in_process_axis(mesh, &axis.name, timeout)
                .into_iter()
                .enumerate()
            {
                ranks[rank].axes.push((axis.name.clone(), handle));
            }
        }
        ranks
    }

    /// A rank's handles from its world group; axes are added with [`Self::push_axis`].
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn from_groups(rank: usize, world: Box<dyn Collective<B>>) -> Self {
        Self {
            rank,
            world,
            axes: Vec::new(),
        }
    }

    /// Adds the rank's group along `axis` (one built with the others, or one
    /// [`Self::take_axis`] took out).
    pub fn push_axis(&mut self, axis: &str, group: Box<dyn Collective<B>>) {
        self.axes.push((axis.to_string(), group));
    }

    /// This rank in the world.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The group of every rank.
    pub fn world(&mut self) -> &mut dyn Collective<B> {
        self.world.as_mut()
    }

    /// This rank's group along `axis`; its [`Collective::rank`] is the coordinate on `axis`.
    ///
    /// # Errors
    /// [`MeshError::UnknownAxis`] when the mesh has no such axis.
    pub fn axis(&mut self, axis: &str) -> Result<&mut dyn Collective<B>, MeshError> {
        match self.axes.iter().position(|(name, _)| name == axis) {
            Some(i) => Ok(self.axes[i].1.as_mut()),
            None => Err(MeshError::UnknownAxis {
                mesh: self
                    .axes
                    .iter()
                    .map(|(name, _)| name.as_str())
                    .collect::<Vec<_>>()
                    .join(" × "),
                axis: axis.to_string(),
            }),
        }
    }

    /// The group of every rank and the group along `axis`, both at once.
    ///
    /// # Errors
    /// [`MeshError::UnknownAxis`] when the mesh has no such axis.
    pub fn world_and_axis(
        &mut self,
        axis: &str,
    ) -> Result<(&mut dyn Collective<B>, &mut dyn Collective<B>), MeshError> {
        self.axis(axis)?;
        let group = self
            .axes
            .iter_mut()
            .find(|(name, _)| name == axis)
            .map(|(_, group)| group.as_mut())
            .expect("checked above");
        Ok((self.world.as_mut(), group))
    }

    /// Removes this rank's group along `axis` and returns it, keeping the others (the
    /// tensor-parallel group, which the model's layers then hold).
    ///
    /// # Errors
    /// [`MeshError::UnknownAxis`] when the mesh has no such axis.
    pub fn take_axis(&mut self, axis: &str) -> Result<Box<dyn Collective<B>>, MeshError> {
        self.axis(axis)?;
        let i = self.axes.iter().position(|(name, _)| name == axis);
        Ok(self.axes.remove(i.expect("checked above")).1)
    }

    /// The traffic of every group this rank holds, summed.
    pub fn counters(&self) -> CollectiveCounters {
        let mut total = self.world.counters();
        for (_, group) in &self.axes {
            let c = group.counters();
            total.calls += c.calls;
            total.elements += c.elements;
        }
        total
    }

    /// Takes this rank's group along `axis` out, dropping the others (a strategy that
    /// communicates along one axis only).
    ///
    /// # Errors
    /// [`MeshError::UnknownAxis`] when the mesh has no such axis.
    pub fn into_axis(mut self, axis: &str) -> Result<Box<dyn Collective<B>>, MeshError> {
        self.axis(axis)?;
        let i = self.axes.iter().position(|(name, _)| name == axis);
        Ok(self.axes.swap_remove(i.expect("checked above")).1)
    }

    /// Marks this rank failed in every group it belongs to.
    pub fn abort(&mut self, reason: &str) {
        self.world.abort(reason);
        for (_, group) in &mut self.axes {
            group.abort(reason);
        }
    }
}

/// Every rank's in-process group along `axis` of `mesh`, in rank order.
///
/// # Panics
/// When `mesh` has no `axis`: the caller names one of its own.
pub(super) fn in_process_axis<B: Backend>(
    mesh: &Mesh,
    axis: &str,
    timeout: Duration,
) -> Vec<Box<dyn Collective<B>>> {
    let mut handles: Vec<Option<Box<dyn Collective<B>>>> = (0..mesh.size()).map(|_| None).collect();
    for members in mesh.groups(axis).expect("the mesh's own axis") {
        let local = InProcess::subgroup(members.clone(), timeout);
        for (rank, handle) in members.into_iter().zip(local) {
            handles[rank] = Some(Box::new(handle));
        }
    }
    handles
        .into_iter()
        .map(|h| h.expect("every rank is in one group"))
        .collect()
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::Tensor;

    use super::*;
    use crate::collective::{CollectiveError, ReduceOp};

    const LONG: Duration = Duration::from_secs(30);

    fn on_mesh<R: Send>(
        mesh: &Mesh,
        timeout: Duration,
        f: impl Fn(usize, MeshCollectives<Flex>) -> R + Sync,
    ) -> Vec<R> {
        let ranks = MeshCollectives::<Flex>::in_process(mesh, timeout);
        std::thread::scope(|s| {
            let jobs: Vec<_> = ranks
                .into_iter()
                .enumerate()
                .map(|(rank, c)| {
                    let f = &f;
                    s.spawn(move || f(rank, c))
                })
                .collect();
            jobs.into_iter().map(|j| j.join().unwrap()).collect()
        })
    }

    #[test]
    fn each_axis_reduces_within_its_groups() {
        let mesh = Mesh::new(&[("dp", 2), ("pp", 3)]).unwrap();
        let results = on_mesh(&mesh, LONG, |rank, mut c| {
            let x = || Tensor::<Flex, 1>::from_floats([rank as f32], &Default::default());
            let sum = |t: Tensor<Flex, 1>| t.into_scalar();
            let dp = c.axis("dp").unwrap();
            let dp_rank = dp.rank();
            let over_dp = sum(dp.all_reduce(x(), ReduceOp::Sum).unwrap());
            let pp = c.axis("pp").unwrap();
            let pp_rank = pp.rank();
            let over_pp = sum(pp.all_reduce(x(), ReduceOp::Sum).unwrap());
            let over_world = sum(c.world().all_reduce(x(), ReduceOp::Sum).unwrap());
            (dp_rank, pp_rank, over_dp, over_pp, over_world)
        });
        for (rank, (dp_rank, pp_rank, over_dp, over_pp, world)) in results.into_iter().enumerate() {
            assert_eq!(vec![dp_rank, pp_rank], mesh.coords(rank));
            // dp groups {s, s+3}: s + s + 3; pp groups {3d..3d+3}: 9d + 3.
            assert_eq!(over_dp, (2 * (rank % 3) + 3) as f32);
            assert_eq!(over_pp, (9 * (rank / 3) + 3) as f32);
            assert_eq!(world, 15.0);
        }
    }

    #[test]
    fn a_failure_in_one_group_releases_the_whole_mesh() {
        // dp groups {0, 2}, {1, 3}; pp groups {0, 1}, {2, 3}. Rank 0 fails. Rank 2 fails in
        // the dp group it shares with 0 and aborts its pp group, which releases rank 3; rank 1
        // fails in the pp group it shares with 0.
        let mesh = Mesh::new(&[("dp", 2), ("pp", 2)]).unwrap();
        let results = on_mesh(&mesh, LONG, |rank, mut c| {
            if rank == 0 {
                c.abort("out of memory");
                return None;
            }
            // Every rank first syncs along dp, then along pp; a failed call aborts the rest.
            let x = Tensor::<Flex, 1>::from_floats([1.0], &Default::default());
            let result = c
                .axis("dp")
                .unwrap()
                .all_reduce(x.clone(), ReduceOp::Sum)
                .and_then(|_| c.axis("pp").unwrap().all_reduce(x, ReduceOp::Sum));
            if let Err(error) = &result {
                c.abort(&error.to_string());
            }
            Some(result.map(|_| ()))
        });
        for result in results.into_iter().flatten() {
            let error = result.unwrap_err();
            assert!(
                matches!(error, CollectiveError::PeerFailed { .. }),
                "{error}"
            );
        }
    }

    #[test]
    fn errors_name_ranks_of_the_world() {
        // In the dp group {1, 3}, group rank 1 is world rank 3.
        let mesh = Mesh::new(&[("dp", 2), ("pp", 2)]).unwrap();
        let results = on_mesh(&mesh, LONG, |rank, mut c| {
            if rank == 3 {
                c.abort("boom");
                return None;
            }
            (rank == 1).then(|| {
                let x = Tensor::<Flex, 1>::from_floats([1.0], &Default::default());
                c.axis("dp")
                    .unwrap()
                    .all_reduce(x, ReduceOp::Sum)
                    .unwrap_err()
            })
        });
        let error = results[1].clone().unwrap();
        assert_eq!(error.culprit(), Some(3), "{error}");
        assert!(error.to_string().contains("on rank 1"), "{error}");
        assert!(matches!(
            MeshCollectives::<Flex>::in_process(&Mesh::flat(1), LONG)
                .pop()
                .unwrap()
                .axis("tp"),
            Err(MeshError::UnknownAxis { .. })
        ));
    }
}
