"""What keeps one trial running and recorded: checkpoints and resume, notices and stops, calls to actors
with a time limit, collectives over the ranks, why a trial stopped, and its logs (console, MLflow, artifacts)."""
