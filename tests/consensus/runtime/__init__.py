"""Tests of the consensus runtime: durable storage on real files and real processes."""
