"""``model.path`` as a Hugging Face Hub id (``Qwen/Qwen2.5-0.5B-Instruct``): fetched into the Hub's
local cache before Ray starts (or found there when offline), and replaced by that local snapshot
directory, so every actor loads the same files with ``local_files_only``."""
from __future__ import annotations

import os
import re

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# what a causal LM needs: config, weights (safetensors), tokenizer files, chat template
_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def is_hub_id(path: str) -> bool:
    """``org/name`` that is not a local path."""
    return (bool(_HUB_ID.match(path)) and not os.path.exists(os.path.expanduser(path))
            and not path.startswith((".", "~", "/")))


def resolve_hub_id(repo_id: str, key: str = "model.path") -> str:
    """The local snapshot dir of ``repo_id``: downloaded where the Hub is reachable, else the cached
    copy; FileNotFoundError naming ``key`` where neither works."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - transformers depends on it
        raise FileNotFoundError(f"{key}={repo_id!r} looks like a Hub id, but huggingface_hub is not "
                                "installed: give a local checkpoint dir") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
    first: Exception | None = None
    if not offline:
        try:
            return snapshot_download(repo_id, allow_patterns=_PATTERNS)
        except Exception as e:  # noqa: BLE001 - no network, unknown repo, gated: try the cache
            first = e
    try:
        return snapshot_download(repo_id, allow_patterns=_PATTERNS, local_files_only=True)
    except Exception:  # noqa: BLE001
        pass
    why = (f"the Hub is not reachable or has no such model ({type(first).__name__}: "
           f"{str(first).splitlines()[0][:160] if str(first) else ''})" if first is not None
           else "HF_HUB_OFFLINE is set")
    raise FileNotFoundError(f"{key}={repo_id!r}: a Hub id, but {why}, and it is not in the local Hub "
                            "cache: download it where the Hub is reachable (huggingface-cli download "
                            f"{repo_id}) or give a local checkpoint dir")
