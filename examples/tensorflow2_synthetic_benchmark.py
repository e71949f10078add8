"""Synthetic TensorFlow 2 benchmark: a Keras application model trained on random data with Horovod.

    horovodrun -np 2 python examples/tensorflow2_synthetic_benchmark.py
    horovodrun -np 2 python examples/tensorflow2_synthetic_benchmark.py --model MobileNetV2 --image-size 64

Each step runs inside ``tf.function`` with ``hvd.DistributedGradientTape``; rank 0 prints images/sec per worker and
for the job, as Horovod's benchmark does.
"""

import argparse
import os
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="use fp16 compression during allreduce")
    parser.add_argument("--model", type=str, default="ResNet50", help="model to benchmark (keras.applications)")
    parser.add_argument("--image-size", type=int, default=224, help="input height and width")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
    parser.add_argument("--num-warmup-batches", type=int, default=10,
                        help="number of warm-up batches that don't count towards benchmark")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="number of batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    parser.add_argument("--no-cuda", action="store_true", default=False,
                        help="accepted for compatibility; this build runs on the CPU")
    return parser.parse_args(argv)


def log(text):
    if hvd.rank() == 0:
        print(text, flush=True)


def main(args):
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    model = getattr(keras.applications, args.model)(weights=None,
                                                    input_shape=(args.image_size, args.image_size, 3))
    opt = keras.optimizers.SGD(0.01)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    rng = np.random.default_rng(hvd.rank())
    data = tf.constant(rng.random((args.batch_size, args.image_size, args.image_size, 3), dtype=np.float32))
    target = tf.constant(rng.integers(0, 1000, size=(args.batch_size, 1)))
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def benchmark_step(first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        gradients = tape.gradient(loss, model.trainable_variables)
        opt.apply(gradients, model.trainable_variables)
        # Start from rank 0's weights and optimizer state (both exist after the first step).
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of workers: {hvd.size()}")
    benchmark_step(first_batch=True)
    timeit.timeit(lambda: benchmark_step(first_batch=False), number=max(0, args.num_warmup_batches - 1))
    rates = []
    for x in range(args.num_iters):
        seconds = timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{x}: {rate:.1f} img/sec per CPU")
        rates.append(rate)
    mean, conf = np.mean(rates), 1.96 * np.std(rates)
    log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")
    hvd.shutdown()
    return mean


if __name__ == "__main__":
    main(parse_args())
