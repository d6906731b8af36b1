"""The RL mathematics: advantages, KL estimators and control, losses, references, resets, optimizer state, growth."""
