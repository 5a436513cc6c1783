//! What a strategy hands over across processes in bytes: a rank's module (its stage) or its
//! optimizer state, gathered on every rank so that any process can assemble the whole model
//! or checkpoint the whole state. Ranks that are threads of one process hand modules over
//! directly; these go through the world's collective, as every fact that crosses processes.

use std::collections::VecDeque;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::record::Recorder;
use burn::tensor::{Bool, Int, Tensor, backend::Backend};

use super::RankError;
use crate::collective::{Collective, CollectiveError};
use crate::optim::{StateError, recorder};
use crate::params::{floats_to_hashes, hashes_to_floats};

/// What [`super::ranks::RankThreads::share`] gathers from every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Share {
    /// The rank's module (its replica, or its stage), encoded.
    Module,
    /// The rank's optimizer state, encoded.
    Optimizer,
}

/// `module`'s parameters, encoded.
pub(crate) fn encode_module<B: Backend, M: Module<B>>(module: &M) -> Result<Vec<u8>, StateError> {
    Recorder::<B>::record(&recorder(), module.clone().into_record(), ())
        .map_err(|e| StateError::Decode(e.to_string()))
}

/// `template` with the parameters `bytes` (from [`encode_module`]) on `device`, keeping the
/// template's parameter ids: another process's ids are its own (drawn at random when its
/// model was built), and the stages are assembled by id.
pub(crate) fn decode_module<B: Backend, M: Module<B>>(
    template: M,
    bytes: &[u8],
    device: &B::Device,
) -> Result<M, StateError> {
    let record = Recorder::<B>::load(&recorder(), bytes.to_vec(), device)
        .map_err(|e| StateError::Decode(e.to_string()))?;
    let decoded = template.clone().load_record(record);
    let mut values = InOrder::default();
    decoded.visit(&mut values);
    Ok(template.map(&mut values))
}

/// Parameter values in the order a module visits them, handed back in that order.
struct InOrder<B: Backend> {
    float: VecDeque<Tensor<B, 1>>,
    int: VecDeque<Tensor<B, 1, Int>>,
    bool: VecDeque<Tensor<B, 1, Bool>>,
}

impl<B: Backend> Default for InOrder<B> {
    fn default() -> Self {
        Self {
            float: VecDeque::new(),
            int: VecDeque::new(),
            bool: VecDeque::new(),
        }
    }
}

impl<B: Backend> ModuleVisitor<B> for InOrder<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.float.push_back(param.val().detach().flatten(0, D - 1));
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        self.int.push_back(param.val().flatten(0, D - 1));
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        self.bool.push_back(param.val().flatten(0, D - 1));
    }
}

impl<B: Backend> ModuleMapper<B> for InOrder<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let flat = self
            .float
            .pop_front()
            .expect("the same module, visited alike");
        param.map(|t| {
            let trainable = t.is_require_grad();
            flat.reshape(t.dims()).detach().set_require_grad(trainable)
        })
    }

    fn map_int<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Int>>,
    ) -> Param<Tensor<B, D, Int>> {
        let flat = self
            .int
            .pop_front()
            .expect("the same module, visited alike");
        param.map(|t| flat.reshape(t.dims()))
    }

    fn map_bool<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Bool>>,
    ) -> Param<Tensor<B, D, Bool>> {
        let flat = self
            .bool
            .pop_front()
            .expect("the same module, visited alike");
        param.map(|t| flat.reshape(t.dims()))
    }
}

/// Every rank's `bytes`, in world-rank order, on every rank: two all-gathers over `world`, of
/// the lengths, then of the bytes padded to the longest (two bytes to an `f32`, exactly).
///
/// # Errors
/// A failed all-gather.
pub(crate) fn all_gather_bytes<B: Backend>(
    world: &mut dyn Collective<B>,
    bytes: &[u8],
    device: &B::Device,
) -> Result<Vec<Vec<u8>>, CollectiveError> {
    let floats = |t: Tensor<B, 1>| {
        t.into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("f32 values")
    };
    let mine = hashes_to_floats([bytes.len() as u64]);
    let lengths = floats(world.all_gather(Tensor::from_floats(mine.as_slice(), device))?);
    let lengths: Vec<usize> = floats_to_hashes(&lengths)
        .into_iter()
        .map(|n| n as usize)
        .collect();
    let pairs = lengths.iter().max().copied().unwrap_or(0).div_ceil(2);
    let mut padded = bytes.to_vec();
    padded.resize(2 * pairs, 0);
    let pieces: Vec<f32> = padded
        .chunks(2)
        .map(|p| f32::from(u16::from_le_bytes([p[0], p[1]])))
        .collect();
    let all = floats(world.all_gather(Tensor::from_floats(pieces.as_slice(), device))?);
    Ok(all
        .chunks(pairs.max(1))
        .zip(&lengths)
        .map(|(rank, &n)| {
            let mut bytes: Vec<u8> = rank
                .iter()
                .flat_map(|&v| (v as u16).to_le_bytes())
                .collect();
            bytes.truncate(n);
            bytes
        })
        .collect())
}

/// This rank's `mine` ([`Share::Module`] or [`Share::Optimizer`] bytes) and every other
/// rank's, through `world`; a failure aborts nothing (the caller's rank does).
pub(crate) fn share<B: Backend>(
    world: &mut dyn Collective<B>,
    mine: Result<Vec<u8>, StateError>,
    device: &B::Device,
) -> Result<Vec<Vec<u8>>, RankError> {
    let mine = mine?;
    Ok(all_gather_bytes(world, &mine, device)?)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use burn::backend::Flex;

    use super::*;
    use crate::collective::InProcess;

    #[test]
    fn bytes_of_every_length_reach_every_rank() {
        let bytes =
            |rank: usize| -> Vec<u8> { (0..(rank * 3 + 1) as u8).map(|b| b ^ 0xa5).collect() };
        let handles = InProcess::<Flex>::group(3, Duration::from_secs(10));
        let seen: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
            let jobs: Vec<_> = handles
                .into_iter()
                .map(|mut c| {
                    s.spawn(move || {
                        let mine = bytes(c.rank());
                        all_gather_bytes(&mut c, &mine, &Default::default()).unwrap()
                    })
                })
                .collect();
            jobs.into_iter().map(|j| j.join().unwrap()).collect()
        });
        let expected: Vec<Vec<u8>> = (0..3).map(bytes).collect();
        for got in seen {
            assert_eq!(got, expected);
        }
    }
}
