"""ci/release_info.py: the version and target dir from cargo metadata, the release targets."""
import os
import sys
import tomllib
import unittest

import helpers  # first: puts ci/ on sys.path

import release_info as ri  # noqa: E402

SCRIPT = os.path.join(helpers.CI, "release_info.py")

# The shape of `cargo metadata --no-deps --format-version 1`, cut to what is read.
METADATA = {
    "packages": [
        {"name": "ncclnet-types", "version": "0.1.0"},
        {"name": "mpib", "version": "1.2.3-rc.1"},
        {"name": "mpib-tools", "version": "0.9.0"},
    ],
    "target_directory": "/work/target-x",
    "workspace_root": "/work/main",
}


class Parsing(unittest.TestCase):
    def test_the_plugin_packages_version_not_another_members(self):
        self.assertEqual(ri.package_version(METADATA), "1.2.3-rc.1")
        self.assertEqual(ri.package_version(METADATA, "mpib-tools"), "0.9.0")
        with self.assertRaises(KeyError):
            ri.package_version({"packages": [{"name": "other", "version": "1.0.0"}]})

    def test_target_directory(self):
        self.assertEqual(ri.target_directory(METADATA), "/work/target-x")

    def test_architectures(self):
        self.assertEqual(ri.triple("x86_64"), "x86_64-unknown-linux-gnu")
        self.assertEqual(ri.triple("aarch64"), "aarch64-unknown-linux-gnu")
        allowed = ri.allowed_needed("aarch64").split(",")
        self.assertEqual(allowed[-1], "ld-linux-aarch64.so.1")
        self.assertIn("libc.so.6", allowed)
        self.assertNotIn("ld-linux-x86-64.so.2", allowed)
        self.assertNotIn("libstdc++.so.6", ri.allowed_needed("x86_64").split(","))


class Command(unittest.TestCase):
    def test_usage_errors_exit_2(self):
        for args in ([], ["triple"], ["triple", "riscv64"], ["allowed-needed"], ["bogus"], ["version", "x"]):
            r = helpers.run([sys.executable, SCRIPT, *args])
            self.assertEqual(r.returncode, 2, f"{args}: {r.stdout} {r.stderr}")
            self.assertIn("usage: ci/release_info.py", r.stderr)
        r = helpers.run([sys.executable, SCRIPT, "triple", "aarch64"])
        self.assertEqual((r.returncode, r.stdout), (0, "aarch64-unknown-linux-gnu\n"))

    def test_a_failing_cargo_is_one_line_and_exit_1(self):
        fake = os.path.join(helpers.tempdir(self), "cargo")
        with open(fake, "w", encoding="utf-8") as f:
            f.write("#!/bin/sh\necho 'error: could not find Cargo.toml' >&2\nexit 101\n")
        os.chmod(fake, 0o755)
        r = helpers.run([sys.executable, SCRIPT, "version"], env={"CARGO": fake})
        self.assertEqual(r.returncode, 1)
        self.assertIn("release_info.py: cargo metadata: error: could not find Cargo.toml", r.stderr)

    @unittest.skipUnless(helpers.shutil.which("cargo"), "needs cargo")
    def test_the_version_is_cargo_tomls(self):
        with open(os.path.join(helpers.ROOT, "Cargo.toml"), "rb") as f:
            want = tomllib.load(f)["package"]["version"]
        r = helpers.run([sys.executable, SCRIPT, "version"], env={"CARGO": "cargo"})
        self.assertEqual((r.returncode, r.stdout.strip()), (0, want), r.stderr)


if __name__ == "__main__":
    unittest.main()
