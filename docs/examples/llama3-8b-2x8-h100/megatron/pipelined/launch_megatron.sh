#!/usr/bin/env bash
# Megatron-LM (core_v0.16.1) launch for the plan (pipesearch export); run from a Megatron-LM checkout
set -euo pipefail
torchrun \
    --nnodes 2 \
    --nproc-per-node 8 \
    --node-rank "${NODE_RANK:?}" \
    --master-addr "${MASTER_ADDR:?}" \
    --master-port "${MASTER_PORT:-29500}" \
    pretrain_gpt.py \
    --num-layers 32 \
    --pipeline-model-parallel-size 2 \
    --tensor-model-parallel-size 1 \
    --pipeline-model-parallel-layout 'Et*8|(t*9|)*2,t*6L' \
    --micro-batch-size 1 \
    --global-batch-size 512 \
    --use-tp-pp-dp-mapping \
    --hidden-size 4096 \
    --num-attention-heads 32 \
    --ffn-hidden-size 14336 \
    --seq-length 8192 \
    --max-position-embeddings 8192 \
    --vocab-size 128256 \
    --group-query-attention \
    --num-query-groups 8 \
    --swiglu \
    --normalization RMSNorm \
    --position-embedding-type rope \
    --rotary-base 500000 \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --norm-epsilon 1e-05 \
    --attention-dropout 0.0 \
    --hidden-dropout 0.0 \
    --bf16 \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --overlap-param-gather \
    --recompute-granularity selective \
    --mock-data \
    --tokenizer-type NullTokenizer \
    --train-iters 10 \
    --lr 1.0e-4
