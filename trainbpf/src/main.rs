use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().collect();
    // The job's trampoline (see job.rs): not a user-facing command.
    if args.get(1).is_some_and(|a| a == "__exec") {
        return ExitCode::from(trainbpf::record::job::exec_trampoline(&args[2..]) as u8);
    }
    // The late-library hold's watchdog (see gpu/watchdog.rs): internal too.
    if args
        .get(1)
        .is_some_and(|a| a == trainbpf::record::gpu::WATCHDOG_SUBCOMMAND)
    {
        return ExitCode::from(trainbpf::record::gpu::watchdog_main(&args[2..]) as u8);
    }
    // The frames' namer (see record/stacks/namer.rs): internal too.
    if args
        .get(1)
        .is_some_and(|a| a == trainbpf::record::stacks::NAMER_SUBCOMMAND)
    {
        return ExitCode::from(trainbpf::record::stacks::namer_main(&args[2..]) as u8);
    }
    match trainbpf::cli::run(trainbpf::cli::Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            // Errors quote paths and names from the command line and from
            // processes: escaped like every other text output.
            eprintln!(
                "trainbpf: {}",
                trainbpf_report::term::sanitize(&format!("{e:#}"))
            );
            ExitCode::FAILURE
        }
    }
}
