# Sourced by ./tw: the process environment Spark needs on a laptop-sized machine.
# PySpark's Python workers must run the venv's interpreter, not the system one.
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PWD/.venv/bin/python}"
export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$PWD/.venv/bin/python}"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
export PATH="$PWD/.venv/bin:$PATH"
