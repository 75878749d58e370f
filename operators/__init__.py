"""Operator catalog: crawl libraries into OpSpecs with runnable seed tasks."""
