"""Warm-start supervised fine-tuning from recordings: SFT samples from a run's recorded rollouts, kept by reward
(`steps.sft.samples`), and veRL's `sft_loss` on them through the update's worker (`steps.sft.train`)."""
