//! Who takes part in a run: the processes, their devices, and the ranks they make.
//!
//! A [`World`] is plain data, validated when it is built (the error names every factor that
//! is off) and connected to nothing: collectives are created from it only when a strategy
//! asks. Inside one process there is one rank per local device (one worker thread each, as
//! Burn's own DDP does); on the CPU several ranks may share the single CPU device.
//!
//! Rank layout: with `P` processes of `L` local devices each, the rank of local device `i` in
//! process `p` is `p * L + i`, so the ranks of one process are contiguous.

mod error;
mod launcher;
mod mesh;
mod process;

pub use error::WorldError;
pub use launcher::EnvLookup;
pub use mesh::{Axis, Mesh, MeshError};
pub use process::{Launcher, ProcessInfo};

/// The most ranks one process drives: each is a thread with its own device handle. The counted
/// allocator keeps a slot per rank (`kiln_core::memory`), and a plan of more is refused.
pub const MAX_LOCAL_RANKS: usize = 1024;

/// The participants of a run, seen from one process.
///
/// `D` is the device type of the backend (`B::Device`).
///
/// # Example
/// ```
/// use kiln_collective::World;
/// // Four ranks as threads of this process, all on the one CPU device.
/// let world = World::local(vec![(); 4]).unwrap();
/// assert_eq!(world.world_size(), 4);
/// assert_eq!(world.rank_of(3), 3);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct World<D> {
    process: ProcessInfo,
    devices: Vec<D>,
    mesh: Mesh,
    /// What every process must agree on beyond the strategy's own checks (a program's config).
    facts: Vec<(String, String)>,
}

impl<D: Clone> World<D> {
    /// A world made of this process alone, one rank per device in `devices`.
    ///
    /// # Errors
    /// [`WorldError::NoDevices`] when `devices` is empty.
    pub fn local(devices: Vec<D>) -> Result<Self, WorldError> {
        Self::new(ProcessInfo::single(), devices)
    }

    /// A world from explicit process information and this process's devices.
    ///
    /// # Errors
    /// [`WorldError::NoDevices`] when `devices` is empty, [`WorldError::Inconsistent`] when a
    /// rank is not below its count.
    pub fn new(process: ProcessInfo, devices: Vec<D>) -> Result<Self, WorldError> {
        process.validate()?;
        if devices.is_empty() {
            return Err(WorldError::NoDevices);
        }
        let mesh = Mesh::flat(process.processes * devices.len());
        Ok(Self {
            process,
            devices,
            mesh,
            facts: Vec::new(),
        })
    }

    /// The same world with its ranks arranged as `mesh` (a flat world is `dp = world size`).
    ///
    /// # Errors
    /// [`WorldError::Mesh`] when the mesh's degrees do not multiply to the world size.
    ///
    /// # Example
    /// ```
    /// use kiln_collective::world::{Mesh, World};
    /// let world = World::local(vec![(); 4])
    ///     .unwrap()
    ///     .with_mesh(Mesh::new(&[("dp", 2), ("pp", 2)]).unwrap())
    ///     .unwrap();
    /// assert_eq!(world.mesh().coords(3), vec![1, 1]);
    /// assert!(World::local(vec![(); 4]).unwrap().with_mesh(Mesh::flat(3)).is_err());
    /// ```
    pub fn with_mesh(mut self, mesh: Mesh) -> Result<Self, WorldError> {
        mesh.check_size(self.world_size())?;
        self.mesh = mesh;
        Ok(self)
    }

    /// The ranks' arrangement along named axes.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The same world, whose ranks also check at start-up that they agree on `value` (say a
    /// program's whole config): processes started with different settings are refused,
    /// naming `name`, before they train a step.
    pub fn agreeing_on(mut self, name: impl Into<String>, value: String) -> Self {
        self.facts.push((name.into(), value));
        self
    }

    /// What the ranks check they agree on, beyond the strategy's own checks.
    pub fn facts(&self) -> &[(String, String)] {
        &self.facts
    }

    /// A world whose process information comes from the launcher's environment (torchrun,
    /// Open MPI's `mpirun`, SLURM's `srun`), or a single process when none is found.
    ///
    /// # Errors
    /// Any [`WorldError`] when the launcher's variables are malformed or inconsistent.
    pub fn from_env(devices: Vec<D>) -> Result<Self, WorldError> {
        Self::new(ProcessInfo::from_env(&launcher::process_env)?, devices)
    }

    /// This process's place among the processes.
    pub fn process(&self) -> &ProcessInfo {
        &self.process
    }

    /// The devices of this process, one per local rank.
    pub fn devices(&self) -> &[D] {
        &self.devices
    }

    /// Ranks held by this process.
    pub fn local_ranks(&self) -> usize {
        self.devices.len()
    }

    /// Ranks in the whole run, over all processes.
    pub fn world_size(&self) -> usize {
        self.process.processes * self.devices.len()
    }

    /// Global rank of this process's local device `local_index`.
    ///
    /// # Panics
    /// When `local_index` is not below [`World::local_ranks`].
    pub fn rank_of(&self, local_index: usize) -> usize {
        assert!(
            local_index < self.devices.len(),
            "local index {local_index} out of {} local ranks",
            self.devices.len()
        );
        self.process.rank * self.devices.len() + local_index
    }

    /// Whether the run spans more than this process.
    pub fn multi_process_enabled(&self) -> bool {
        self.process.processes > 1
    }

    /// Whether there is more than one rank at all.
    pub fn data_parallel_enabled(&self) -> bool {
        self.world_size() > 1
    }

    /// Whether this process holds rank 0, which logs, renders progress and checkpoints.
    pub fn is_main_process(&self) -> bool {
        self.process.rank == 0
    }
}
