//! A held-out part of a data set, drawn at random but fixed by a seed (as `datasets`'
//! `train_test_split(test_size, seed)`): the same run, resumed, holds out the same examples.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::read::DataSet;
use crate::llm::LlmError;

impl DataSet {
    /// Splits off `fraction` of the examples (rounded, at least one, and leaving at least
    /// one), chosen by a shuffle seeded with `seed`: `(train, held_out)`, each in the file's
    /// order, each example keeping its line or row for errors.
    ///
    /// # Errors
    /// [`LlmError::Path`] for a fraction outside `(0, 1)` or a file of one example.
    pub fn split_off(self, fraction: f64, seed: u64) -> Result<(DataSet, DataSet), LlmError> {
        let refuse = |reason: String| LlmError::Path {
            path: self.path().display().to_string(),
            reason,
        };
        if !(fraction > 0.0 && fraction < 1.0) {
            return Err(refuse(format!(
                "--eval-split must be a fraction between 0 and 1 (0.1 holds out a tenth), got \
                 {fraction}"
            )));
        }
        let n = self.len();
        if n < 2 {
            return Err(refuse(format!(
                "holds {n} example; --eval-split needs two or more (one to train, one to \
                 evaluate), or give --eval-data"
            )));
        }
        let held = ((fraction * n as f64).round() as usize).clamp(1, n - 1);
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut StdRng::seed_from_u64(seed));
        let mut is_held = vec![false; n];
        for &i in &order[..held] {
            is_held[i] = true;
        }
        Ok(self.partition(&is_held))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::llm::Example;

    fn texts(data: &DataSet) -> Vec<String> {
        data.examples()
            .iter()
            .map(|e| match e {
                Example::Text(t) => t.clone(),
                _ => unreachable!(),
            })
            .collect()
    }

    #[test]
    fn a_seeded_fraction_is_held_out_in_file_order() {
        let data = || {
            let examples = (0..20).map(|i| Example::Text(format!("{i}"))).collect();
            DataSet::from_examples(Path::new("d.jsonl"), examples)
        };
        let (train, held) = data().split_off(0.25, 7).unwrap();
        assert_eq!((train.len(), held.len()), (15, 5));
        let (a, b) = (texts(&train), texts(&held));
        let mut all: Vec<usize> = a.iter().chain(&b).map(|t| t.parse().unwrap()).collect();
        all.sort();
        assert_eq!(
            all,
            (0..20).collect::<Vec<_>>(),
            "disjoint, and every example kept"
        );
        let ordered = |v: &[String]| {
            let n: Vec<u32> = v.iter().map(|t| t.parse().unwrap()).collect();
            n.is_sorted()
        };
        assert!(ordered(&a) && ordered(&b));
        // The same seed holds out the same examples; another seed others; errors keep lines.
        assert_eq!(texts(&data().split_off(0.25, 7).unwrap().1), b);
        assert_ne!(texts(&data().split_off(0.25, 8).unwrap().1), b);
        let line: usize = b[0].parse::<usize>().unwrap() + 1;
        assert!(
            held.error(0, "x".into())
                .to_string()
                .contains(&format!(":{line}:"))
        );
        // At least one each way; fractions outside (0, 1) and one example refused.
        assert_eq!(data().split_off(0.001, 7).unwrap().1.len(), 1);
        assert_eq!(data().split_off(0.999, 7).unwrap().0.len(), 1);
        for bad in [0.0, 1.0, f64::NAN, -0.5] {
            let err = data().split_off(bad, 7).unwrap_err().to_string();
            assert!(err.contains("--eval-split"), "{err}");
        }
        let one = DataSet::from_examples(Path::new("d.jsonl"), vec![Example::Text("a".into())]);
        assert!(
            one.split_off(0.5, 7)
                .unwrap_err()
                .to_string()
                .contains("two or more")
        );
    }
}
