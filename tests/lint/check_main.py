"""The command line every repository check shares (tests/lint/evidence_paths.py,
tests/docs/changelog_current.py): `--repo DIR` runs check(DIR), which returns (exit status,
message); `--self-test` runs self_test(), which plants what the check must catch."""
import argparse
import os


def main(doc, check, self_test):
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", help="the source tree to check")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if not args.repo:
        parser.error("give --repo <source dir> or --self-test")
    status, message = check(os.path.abspath(args.repo))
    print(message)
    return status
