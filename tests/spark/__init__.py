"""Tests of the Spark audit (``spark/``), on one real SparkSession per process."""
