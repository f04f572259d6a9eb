"""The streaming session drops YARN's and MapReduce's default properties, and nothing else."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from tidewater.spark import YARN_AND_MAPREDUCE_DEFAULTS, drop_unread_hadoop_defaults, hadoop_configuration_xml


def properties(spark) -> dict[str, tuple[str | None, frozenset[str]]]:
    """name -> (value, sources) of the driver's Hadoop configuration."""
    return {
        p.findtext("name"): (p.findtext("value"), frozenset(s.text for s in p.iter("source")))
        for p in ET.fromstring(hadoop_configuration_xml(spark)).iter("property")
    }


def test_only_yarn_and_mapreduce_defaults_leave_and_every_other_value_stays(spark):
    configuration = spark.sparkContext._jsc.hadoopConfiguration()
    before = properties(spark)
    only_theirs = {name for name, (_, sources) in before.items() if sources and sources <= YARN_AND_MAPREDUCE_DEFAULTS}
    assert len(only_theirs) > 100  # this Spark's driver loads both files: the trim is not a no-op
    try:
        dropped = drop_unread_hadoop_defaults(spark)
        after = properties(spark)
    finally:
        configuration.reloadConfiguration()  # the shared session gets its full configuration back
    assert dropped == len(only_theirs)
    assert set(before) - set(after) == only_theirs
    assert all(after[name][0] == before[name][0] for name in after)  # core-default's and Spark's, untouched
    assert after["fs.AbstractFileSystem.file.impl"][0] == "org.apache.hadoop.fs.local.LocalFs"  # checkpoints
    assert properties(spark).keys() == before.keys()
