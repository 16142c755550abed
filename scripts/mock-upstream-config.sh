# Sourced by the gateway benchmarks (bench-gateway.sh, soak.sh), not run.
# mock_upstream_config DIR URL: writes DIR/prices.toml (model `mock-price`) and DIR/frugal.toml,
# whose upstream `mock` at URL is priced by it; a caller appends more [[serve.upstream]]s.
mock_upstream_config() {
  cat > "$1/prices.toml" <<TOML
[[model]]
name = "mock-price"
input = 0.15
output = 0.60
TOML
  cat > "$1/frugal.toml" <<TOML
[prices]
files = ["prices.toml"]

[[serve.upstream]]
name = "mock"
url = "$2"
price = "mock-price"
TOML
}
