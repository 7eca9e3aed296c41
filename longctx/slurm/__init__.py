"""Slurm chains: cluster profiles, batch scripts, chain submission, status and cancellation.

Public API::

    load_profile(name_or_path) -> Profile                 # packaged: leonardo, generic, local
    job_settings(rp, profile=, overrides=) -> JobSettings   # validated: QoS, time vs exit duration, signal
    render(rp, profile=, overrides=, out_dir=, longctx_command=) -> Rendered   # .write()
    estimate_chain(rp, settings) -> ChainEstimate
    submit(rendered, rp, chain=, dry_run=) -> SubmitResult  # sbatch --dependency=afterany:PREV, ledger
    job_end(rp, exit_code, scripts_dir=) -> JobEnd          # run by every chain job after `stage run`
    chain_status(rp) -> ChainStatus
    cancel(rp) -> list[str]
    SrunLauncher.from_environment()                         # `stage run --launcher srun` inside a job

The chain never decides what to train: each job runs `longctx stage run`, which reads the disk.
"""
