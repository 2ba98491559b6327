"""lmdeploy/serve (v0.16.0): core.AsyncEngine only."""
