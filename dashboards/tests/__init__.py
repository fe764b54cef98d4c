"""Tests of the operator pages, mirroring the package: pages/, selectors/, figures/, browser/."""
