"""Engine integrations of tokenmeter (one module per engine)."""
