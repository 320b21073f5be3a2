fn main() {
    std::process::exit(tmpfsctl::cli::main());
}
