"""Tasks with verifiable rewards, their answer extraction, the code sandbox and the hack detectors."""
