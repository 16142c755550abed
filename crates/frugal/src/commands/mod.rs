//! One function per command: resolve inputs, call the libraries, print.

mod deploy;
mod eval;
mod eval_cache;
mod eval_cache_verify;
mod eval_route;
mod keys;
mod ledger;
mod plan;
mod prices;
mod quantize;
mod report;
mod route;

use std::path::PathBuf;

use anyhow::{Context, Result};
use frugal_cost::Catalog;

use crate::cli::{
    BatchCommand, Cli, Command, DeployCommand, EvalCommand, KeysCommand, LedgerCommand,
    RouteCommand,
};
use crate::config::{self, Sources};

pub fn run(cli: Cli) -> Result<()> {
    let data_home = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")));
    let config = config::resolve(Sources {
        config_flag: cli.config.as_deref(),
        config_env: None,
        ledger_flag: cli.ledger.as_deref(),
        ledger_env: None,
        price_flags: &cli.price_files,
        data_home,
    })?;
    let catalog = Catalog::load_with(&config.price_files, prices::refreshed(&config).as_deref())
        .context("cannot load the price catalog")?;
    let mut command = cli.command;
    crate::data::Data::new(config.data_home.as_deref()).locate_inputs(&mut command)?;
    match command {
        Command::EvalCache(args) => eval_cache::run(&args),
        Command::EvalRoute(args) => eval_route::run(&args),
        Command::Route(RouteCommand::Train(args)) => route::train(&args),
        Command::Eval(EvalCommand::Ppl(args)) => eval::ppl(&args, config.data_home.as_deref()),
        Command::Eval(EvalCommand::Tasks(args)) => eval::tasks(&args, config.data_home.as_deref()),
        Command::Eval(EvalCommand::Embedder(args)) => eval::embedder(&args),
        Command::Train(args) => crate::train::run(&config, &catalog, &args),
        Command::Batch(BatchCommand::Run(args)) => crate::batch::run(&config, &catalog, &args),
        Command::Plan(args) => plan::run(&config, &catalog, &args),
        Command::Tune(args) => crate::tune::run(&config, &catalog, &args),
        Command::Watch(args) => crate::watch::run(&config, &catalog, &args),
        Command::Prices(args) => prices::run(&config, &catalog, &args),
        Command::Ledger(LedgerCommand::Import(args)) => {
            let ledger = config.open_ledger()?;
            ledger::import(ledger, &catalog, &args)
        }
        Command::Ledger(LedgerCommand::Info(args)) => ledger::info(&config, &args),
        Command::Ledger(LedgerCommand::Migrate(args)) => ledger::migrate(&args),
        Command::Report(args) => report::run(&config, &catalog, &args),
        Command::Serve(args) => crate::serve::run(&config, &catalog, &args),
        Command::Quantize(args) => quantize::run(&args),
        Command::Bench(args) => crate::bench::run(&catalog, &args),
        Command::Keys(KeysCommand::New(args)) => keys::new(&args),
        Command::Deploy(DeployCommand::Kubernetes(args)) => {
            deploy::kubernetes(cli.config.as_deref(), &catalog, &args)
        }
    }
}
