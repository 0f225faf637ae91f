"""Package layout: `packed_ss/` plus the Triton kernels in `kernels/`, installed as `packed_ss.kernels`."""
from setuptools import setup

setup(
    packages=["packed_ss", "packed_ss.schedules", "packed_ss.kernels"],
    package_dir={"packed_ss": "packed_ss", "packed_ss.kernels": "kernels"},
    package_data={"packed_ss": ["assets/*/*"]},
)
