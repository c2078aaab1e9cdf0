#!/usr/bin/env bash
# torchtitan 0.3.0 launch for the plan (pipesearch export)
set -euo pipefail
torchrun \
    --nnodes 2 \
    --nproc-per-node 8 \
    --node-rank "${NODE_RANK:?}" \
    --master-addr "${MASTER_ADDR:?}" \
    --master-port "${MASTER_PORT:-29500}" \
    -m torchtitan.train \
    --module llama3 \
    --config llama3_8b \
    --parallelism.pipeline_parallel_degree 2 \
    --parallelism.pipeline_parallel_schedule Interleaved1F1B \
    --parallelism.pipeline_parallel_microbatch_size 1 \
    --parallelism.module_fqns_per_model_part tok_embeddings,layers.0,layers.1,layers.2,layers.3,layers.4,layers.5,layers.6,layers.7 layers.8,layers.9,layers.10,layers.11,layers.12,layers.13,layers.14,layers.15,layers.16 layers.17,layers.18,layers.19,layers.20,layers.21,layers.22,layers.23,layers.24,layers.25 layers.26,layers.27,layers.28,layers.29,layers.30,layers.31,norm,lm_head \
    --parallelism.tensor_parallel_degree 1 \
    --parallelism.data_parallel_replicate_degree 1 \
    --parallelism.data_parallel_shard_degree 8 \
    --training.local_batch_size 64 \
    --training.global_batch_size 512 \
    --training.seq_len 8192 \
    --training.disable_cuda_graphs \
    activation-checkpoint:none
