# Sourced by the H200 scripts (bench/device.sh, pipeline_vllm.sh, device_sft_rl.sh), from the
# repository root: the device machine's environment for the project. /tmp/site holds .devpkgs,
# /tmp/vsite the vLLM bundle (../shared/tools/DEVICE-VLLM.md); flashinfer is not in the bundle (its
# sampler must stay off) and the engine runs in the sampler's own process (its weight loads hand
# it tensors, not pickles).
export PYTHONPATH=/tmp/site:/tmp/vsite:$PWD PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 \
       TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
       RAY_DEDUP_LOGS=0 WANDB_MODE=disabled
