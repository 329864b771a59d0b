"""The training job: the TrainSpec, the trainer, the job config and its checks, the command line, the
learning-rate schedule and the dense-shadow validation."""
