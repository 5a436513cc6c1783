//! Before the ranks exchange a single gradient, they check that they run the same job: the
//! same mesh, model layout, dtype and settings. Processes started with different flags,
//! configs or models would otherwise all-reduce buffers that do not correspond, and train on
//! a wrong sum without a word.

use burn::module::Module;
use burn::tensor::{Element, Tensor, backend::Backend};

use super::RankError;
use crate::collective::Collective;
use crate::params::{floats_to_hashes, hashes_to_floats};

/// One fact every rank must share: its name, as errors say it, and its value.
pub(crate) type Fact = (String, String);

/// The facts of the float dtype `B` computes in.
pub(crate) fn dtype_fact<B: Backend>() -> Fact {
    (
        "float dtype".into(),
        format!("{:?}", <B::FloatElem as Element>::dtype()),
    )
}

/// The fact of `model`'s parameter values, exactly (every value's bits): processes that cut
/// stages or shards from their own copies of a model must have built the same one, or they
/// would train a mix of models. (Ddp needs no such fact: its replicas take rank 0's values.)
pub(crate) fn values_fact<B: Backend, M: Module<B>>(model: &M) -> Fact {
    let all: String = crate::params::fingerprints::<B, M>(model)
        .iter()
        .map(|f| format!("{:016x}", f.hash))
        .collect();
    (
        "model's values digest".into(),
        format!(
            "digest {:016x}; every process must build the model from the same seed or \
             checkpoint",
            digest(&all)
        ),
    )
}

fn digest(text: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(text.as_bytes());
    u64::from_le_bytes(hash[..8].try_into().expect("8 bytes"))
}

/// Checks that every rank of `world` holds the same `facts` (the same names in the same order
/// everywhere); one all-gather of their digests.
///
/// # Errors
/// [`RankError::Disagree`] naming the first fact and the first rank that differ from this
/// rank, and a failed all-gather.
pub(crate) fn agree<B: Backend>(
    world: &mut dyn Collective<B>,
    facts: &[Fact],
    device: &B::Device,
) -> Result<(), RankError> {
    let mine: Vec<u64> = facts.iter().map(|(_, value)| digest(value)).collect();
    let floats = hashes_to_floats(mine.iter().copied());
    let all = world
        .all_gather(Tensor::from_floats(floats.as_slice(), device))?
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 digests");
    let all = floats_to_hashes(&all);
    for (rank, theirs) in all.chunks(mine.len().max(1)).enumerate() {
        if let Some(i) = (0..mine.len()).find(|&i| theirs[i] != mine[i]) {
            let (fact, value) = &facts[i];
            return Err(RankError::Disagree {
                fact: fact.clone(),
                other: rank,
                value: value.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use burn::backend::Flex;

    use super::*;
    use crate::collective::InProcess;

    fn run(facts: impl Fn(usize) -> Vec<Fact> + Sync) -> Vec<Result<(), RankError>> {
        let handles = InProcess::<Flex>::group(3, Duration::from_secs(10));
        std::thread::scope(|s| {
            let jobs: Vec<_> = handles
                .into_iter()
                .map(|mut c| {
                    let facts = &facts;
                    s.spawn(move || {
                        let mine = facts(c.rank());
                        agree(&mut c, &mine, &Default::default())
                    })
                })
                .collect();
            jobs.into_iter().map(|j| j.join().unwrap()).collect()
        })
    }

    #[test]
    fn the_same_facts_agree_and_a_different_one_is_named() {
        let fact = |name: &str, value: &str| (name.to_string(), value.to_string());
        let same = run(|_| vec![fact("model", "mlp"), fact("settings", "lr 0.1")]);
        assert!(same.iter().all(Result::is_ok));
        let lr = |rank: usize| if rank == 2 { "lr 0.2" } else { "lr 0.1" };
        let differ = run(|rank| vec![fact("model", "mlp"), fact("settings", lr(rank))]);
        let named = |r: &Result<(), RankError>| match r {
            Err(RankError::Disagree { fact, other, .. }) => (fact.clone(), *other),
            other => panic!("{other:?}"),
        };
        assert_eq!(named(&differ[0]), ("settings".to_string(), 2));
        assert_eq!(named(&differ[2]), ("settings".to_string(), 0));
        let message = differ[2].clone().unwrap_err().to_string();
        assert!(
            message.contains("lr 0.2") && message.contains("rank 0"),
            "{message}"
        );
    }

    #[test]
    fn the_values_fact_tells_models_apart_by_their_values_alone() {
        use burn::module::Param;
        use burn::nn::LinearConfig;
        let device = Default::default();
        let model = LinearConfig::new(4, 3).init::<Flex>(&device);
        // Read first: Burn draws a lazily initialised parameter on first use, in each clone
        // that has not been read (why the strategies materialise a model before copying it).
        let same = values_fact::<Flex, _>(&model);
        assert_eq!(values_fact::<Flex, _>(&model.clone()), same);
        // The same ids and shapes, one value one ulp apart.
        let weight = model.weight.val();
        let nudged = weight.clone().slice([0..1, 0..1]).add_scalar(1e-7);
        let other = burn::nn::Linear {
            weight: Param::initialized(model.weight.id, weight.slice_assign([0..1, 0..1], nudged)),
            bias: model.bias.clone(),
        };
        let (name, value) = values_fact::<Flex, _>(&other);
        assert_eq!(name, "model's values digest");
        assert_ne!(value, same.1);
        assert!(value.contains("same seed or checkpoint"), "{value}");
    }
}
