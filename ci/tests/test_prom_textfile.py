"""The Prometheus textfile (MPIB_PROM_FILE) parses with prometheus_client's own parser.

tests/fixtures/prom/mpib.prom is what the plugin's exporter writes for a fixed view (a Rust
unit test, src/telemetry/prom_tests.rs, keeps it equal to format_prometheus's output)."""
import unittest

import helpers

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # ci/setup.sh test installs python3-prometheus-client
    text_string_to_metric_families = None


@unittest.skipIf(text_string_to_metric_families is None,
                 "prometheus_client is not installed (Debian: python3-prometheus-client; ci/setup.sh test installs it)")
class PromTextfile(unittest.TestCase):
    def setUp(self):
        text = helpers.read_fixture("prom", "mpib.prom")
        self.families = list(text_string_to_metric_families(text))
        self.samples = {}
        for f in self.families:
            for s in f.samples:
                key = (s.name,) + tuple(sorted(s.labels.items()))
                self.assertNotIn(key, self.samples, f"a sample twice: {key}")
                self.samples[key] = (f.type, s.value)

    def sample(self, name, **labels):
        return self.samples[(name,) + tuple(sorted(labels.items()))]

    def test_every_family_has_a_type_and_help(self):
        self.assertGreater(len(self.families), 20)
        for f in self.families:
            self.assertIn(f.type, ("counter", "gauge", "summary"), f.name)
            self.assertTrue(f.documentation, f"{f.name} has no HELP")
            self.assertTrue(f.name.startswith("mpib_"), f.name)

    def test_per_nic_counters_and_gauges(self):
        self.assertEqual(self.sample("mpib_rail_bytes_total", nic="mlx5_0:1", rail="sout"), ("counter", 3 << 20))
        self.assertEqual(self.sample("mpib_rail_errors_total", nic="mlx5_1:1", rail="sup"), ("counter", 2))
        self.assertEqual(self.sample("mpib_rail_failed_connections", nic="mlx5_1:1", rail="sup"), ("gauge", 1))
        self.assertEqual(self.sample("mpib_rail_srtt_seconds", nic="mlx5_0:1", rail="sout"), ("gauge", 21e-6))
        kind, p99 = self.sample("mpib_rail_latency_seconds", nic="mlx5_0:1", rail="sout", quantile="0.99")
        self.assertEqual(kind, "summary")
        self.assertAlmostEqual(p99, 2.9e-6)
        self.assertEqual(self.sample("mpib_rail_latency_seconds_count", nic="mlx5_0:1", rail="sout"), ("summary", 10))

    def test_worst_peers(self):
        kind, p99 = self.sample("mpib_peer_latency_p99_seconds", peer="GID fe80::b", nic="mlx5_0:1", rail="sout")
        self.assertEqual((kind, p99), ("gauge", 250e-6))
        self.assertEqual(self.sample("mpib_peer_failovers_total", peer="GID fe80::c", nic="mlx5_1:1", rail="sup"),
                         ("counter", 1))
        counters = [f for f in self.families if f.type == "counter"]
        self.assertTrue(all(s.name.endswith("_total") for f in counters for s in f.samples))


if __name__ == "__main__":
    unittest.main()
