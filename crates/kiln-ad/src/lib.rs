//! Algorithm Distillation on Dark Room: the environment, the source RL algorithm producing
//! learning histories, the data set of history windows, the causal transformer and in-context
//! evaluation, all trained through Kiln's strategies. Empty until that work lands.
