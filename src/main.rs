fn main() {
    std::process::exit(unkai::cli::main());
}
