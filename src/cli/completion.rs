//! `unkai completion SHELL` and `unkai manpage [DIR]`: shell completions and man pages,
//! generated from the command line's own definition (clap_complete, clap_mangen), so they
//! always name the flags this binary has.
//!
//! Not for: anything a command does (this only describes them).

use std::path::PathBuf;

use anyhow::Context;

/// Print a completion script for a shell.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  source <(unkai completion bash)                                # this shell\n  unkai completion bash > /etc/bash_completion.d/unkai\n  unkai completion zsh > \"${fpath[1]}/_unkai\"\n  unkai completion fish > ~/.config/fish/completions/unkai.fish"
)]
pub struct Args {
    /// The shell.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// Write the man pages: unkai(1) and one per subcommand (unkai-mount(1), ...).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai manpage | man -l -                          # read unkai(1) now\n  unkai manpage /usr/local/share/man/man1           # install them all\n  man unkai-mount"
)]
pub struct ManArgs {
    /// Where to write unkai.1 and unkai-SUBCOMMAND.1 [default: unkai(1) alone, to standard
    /// output].
    dir: Option<PathBuf>,
}

pub fn run(a: Args, mut cmd: clap::Command) -> anyhow::Result<()> {
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "unkai", &mut out);
    print(&out)
}

/// Writes `out` to standard output; a reader that stopped early (`| head`) is no error.
fn print(out: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().write_all(out) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

pub fn manpage(a: ManArgs, cmd: clap::Command) -> anyhow::Result<()> {
    let Some(dir) = a.dir else {
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut out)?;
        return print(&out);
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    clap_mangen::generate_to(cmd, &dir)
        .with_context(|| format!("cannot write the man pages to {}", dir.display()))?;
    println!("unkai: man pages written to {}", dir.display());
    Ok(())
}
