"""lmdeploy/pytorch (v0.16.0): only utils.singleton."""
