"""Secrets never leave through evaluation text.

An answer's error message, the sandbox's log tail and the feedback built from them go into the
next turn's prompt, ``episodes.jsonl``, the W&B samples table and the console. An answer once
raised an error carrying the Ray auth token. :class:`Scrubber` replaces, in any such text:

* the values (8 characters or more) of this process's environment variables whose names look
  secret (:data:`SECRET_NAME`), except paths and credential-free URLs;
* the secrets in well-known files this process can read (:data:`SECRET_FILES`: ~/.netrc
  passwords, the Hugging Face token, Ray's auth token, AWS / gcloud / gh / git credentials);
* strings in known secret formats (:data:`PATTERNS`: AWS key ids, GitHub, Hugging Face, OpenAI /
  Anthropic, Slack tokens, PEM private keys, JWTs, URL passwords, and hex / opaque tokens that
  follow a token-ish word);

with ``[redacted]``, then cuts the text to a length. A secret cut off at either end of the text
(the sandbox truncates its logs) is redacted too. Hex build hashes in ordinary compiler output
are not secret-shaped (no token-ish word before them) and stay.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REDACTED = "[redacted]"
MIN_SECRET_LEN = 8
# Environment variable names whose values are secrets: a secret word anywhere in the name, or a
# vendor prefix (then only a random-looking value counts: WANDB_NAME=my-run is no secret).
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSW|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE|"
                         r"CERT|DSN|WEBHOOK|^DATABASE_URL$", re.IGNORECASE)
VENDOR_NAME = re.compile(r"^(AWS_|WANDB_|HF_|HUGGING|GITHUB|GH_|GITLAB|OPENAI|ANTHROPIC|AZURE_|GOOGLE_|GCP_|SLACK|"
                         r"NGC_|RAY_REDIS)", re.IGNORECASE)
# Names that match SECRET_NAME but never hold a secret.
_NOT_SECRET_NAME = re.compile(r"^(TOKENIZERS_PARALLELISM|WANDB_MODE|WANDB_DIR|WANDB_PROJECT|WANDB_ENTITY|"
                              r"WANDB_RUN_GROUP|WANDB_SILENT|WANDB_CACHE_DIR|WANDB_CONFIG_DIR|HF_HOME|"
                              r"HF_HUB_OFFLINE|HF_DATASETS_OFFLINE|HF_HUB_CACHE|HF_HUB_ENABLE_HF_TRANSFER|"
                              r"RAY_AUTH_MODE|.*_PATH|.*_DIR|.*_FILE)$", re.IGNORECASE)
_FREE_URL = re.compile(r"https?://[^\s@/]+(/\S*)?")

# Known secret formats. Each pattern's last group (or the whole match) is what is redacted.
_TOKENISH = r"(?:token|secret|passw(?:or)?d|passwd|pwd|api[_-]?key|access[_-]?key|private[_-]?key|auth\w*|" \
            r"credential|cookie|session[_-]?id|bearer|wandb[_-]?key|key)"
PATTERNS: dict[str, re.Pattern[str]] = {
    "pem_private_key": re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]*?"
                                  r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|\Z)"),
    "aws_access_key_id": re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|AGPA)[0-9A-Z]{16}\b"),
    "github_token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{20,})\b"),
    "huggingface_token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "openai_anthropic_key": re.compile(r"\bsk-(?:ant-|proj-|svcacct-)?[A-Za-z0-9_-]{20,}"),
    "slack_token": re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    "jwt": re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    "url_password": re.compile(r"(?<=://)[^\s/:@]+:([^\s/@]+)(?=@)"),
    # W&B keys are 40 hex digits: only after a key-ish word (git and build hashes are 40 hex too)
    "hex40_after_keyword": re.compile(rf"(?i){_TOKENISH}[\"'\s]*[:=]?[\"'\s]*\b([0-9a-f]{{40}})\b"),
    # 64-hex tokens (Ray, session secrets): after a token-ish word or an '='
    "hex64_after_keyword": re.compile(rf"(?i)(?:{_TOKENISH}[\"'\s]*[:=]?|=)[\"'\s]*\b([0-9a-f]{{64}})\b"),
    # `token=...`, `"api_key": "..."`, `Authorization: Bearer ...`: an opaque value (see _opaque)
    # after a token-ish word and ':' or '='
    "value_after_keyword": re.compile(rf"(?i)\b\w*{_TOKENISH}\w*[\"']?\s*[:=]\s*[\"']?(?:bearer\s+|basic\s+)?"
                                      r"([A-Za-z0-9_./+=-]{16,})"),
    "bearer": re.compile(r"(?i)\b(?:bearer|basic)\s+([A-Za-z0-9._~+/=-]{16,})"),
}


def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def _read(path: Path, limit: int = 1 << 20) -> str | None:
    try:
        if path.is_file() and path.stat().st_size <= limit:
            return path.read_text(errors="replace")
    except OSError:
        pass
    return None


def _netrc(text: str) -> list[str]:
    toks = text.split()
    return [toks[i + 1] for i, t in enumerate(toks[:-1]) if t in ("password", "passwd", "account")]


def _whole(text: str) -> list[str]:
    return [text.strip()]


def _key_values(text: str) -> list[str]:
    """``key = value`` / ``key: value`` lines (AWS credentials, gh hosts.yml)."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*([\w.-]+)\s*[:=]\s*(\S+)", line)
        if m and re.search(r"key|token|secret|password|session", m.group(1), re.IGNORECASE):
            out.append(m.group(2).strip("'\""))
    return out


def _json_secrets(text: str) -> list[str]:
    try:
        data = json.loads(text)
    except ValueError:
        return []
    out: list[str] = []

    def walk(v: Any, key: str = "") -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, str(k))
        elif isinstance(v, list):
            for x in v:
                walk(x, key)
        elif isinstance(v, str) and re.search(r"key|token|secret|password|auth", key, re.IGNORECASE):
            out.append(v)
            out.extend(line for line in v.splitlines() if len(line) >= MIN_SECRET_LEN)  # PEM bodies
    walk(data)
    return out


def _git_credentials(text: str) -> list[str]:
    return re.findall(r"://[^\s/:@]*:([^\s/@]+)@", text)


# (path relative to $HOME, or absolute; how to take the secrets out of it)
SECRET_FILES: tuple[tuple[str, Any], ...] = (
    (".netrc", _netrc),                                            # W&B keeps its API key here
    (".cache/huggingface/token", _whole),
    (".huggingface/token", _whole),
    (".ray/auth_token", _whole),                                   # Ray token auth (ray get-auth-token)
    (".aws/credentials", _key_values),
    (".config/gh/hosts.yml", _key_values),
    (".git-credentials", _git_credentials),
    (".config/gcloud/application_default_credentials.json", _json_secrets),
    (".docker/config.json", _json_secrets),
    (".kaggle/kaggle.json", _json_secrets),
)
# Environment variables naming a secret file (read whole).
SECRET_FILE_VARS = ("RAY_AUTH_TOKEN_PATH", "HF_TOKEN_PATH", "GOOGLE_APPLICATION_CREDENTIALS")


def _is_secret_value(value: str) -> bool:
    v = value.strip()
    if len(v) < MIN_SECRET_LEN or v.lower() in ("true", "false", "offline", "online", "disabled", "enabled"):
        return False
    if v.startswith(("/", "~", "./")) or _FREE_URL.fullmatch(v):
        return False  # a path or an address, not a secret
    return True


def _env_secrets(environ: Mapping[str, str]) -> list[str]:
    out = []
    for k, v in environ.items():
        if _NOT_SECRET_NAME.match(k) or not _is_secret_value(v):
            continue
        if SECRET_NAME.search(k) or VENDOR_NAME.match(k) and _opaque(v.strip()):
            out.append(v)
    return out


def _file_secrets(home: Path, environ: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    hf_home = environ.get("HF_HOME")
    files = [(home / rel, how) for rel, how in SECRET_FILES]
    if hf_home:
        files.append((Path(hf_home) / "token", _whole))
    for var in SECRET_FILE_VARS:
        if environ.get(var):
            files.append((Path(environ[var]), _json_secrets if environ[var].endswith(".json") else _whole))
    for path, how in files:
        text = _read(path)
        if text:
            out += how(text)
    return out


def _ray_secrets() -> list[str]:
    """The auth token this process's Ray holds, when Ray is already loaded (never imported here)."""
    import sys

    raylet = sys.modules.get("ray._raylet")
    if raylet is None:
        return []
    try:
        headers = raylet.AuthenticationTokenLoader.instance().get_token_for_http_header() or {}
        return [v.split(None, 1)[-1] for v in headers.values() if isinstance(v, str)]
    except Exception:  # noqa: BLE001 - no token, no Ray auth, another version: nothing to add
        return []


class Scrubber:
    def __init__(self, secrets: Iterable[str] = (), max_chars: int | None = None):
        values = {s.strip() for s in secrets if isinstance(s, str)}
        self.secrets = sorted((s for s in values if len(s) >= MIN_SECRET_LEN), key=len, reverse=True)
        self.max_chars = max_chars
        self._literal = re.compile("|".join(re.escape(s) for s in self.secrets)) if self.secrets else None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None, home: str | Path | None = None,
                         max_chars: int | None = None) -> "Scrubber":
        env = os.environ if environ is None else environ
        root = Path(home) if home is not None else _home()
        return cls(_env_secrets(env) + _file_secrets(root, env) + _ray_secrets(), max_chars)

    def scrub(self, text: Any, max_chars: int | None = None) -> Any:
        """``text`` with every secret replaced by ``[redacted]``, then cut to ``max_chars`` (or the
        scrubber's own limit). Anything that is not a str is returned as it is."""
        if not isinstance(text, str) or not text:
            return text
        if self._literal is not None:
            text = self._literal.sub(REDACTED, text)
            text = self._cut_ends(text)
        for pattern in PATTERNS.values():
            text = pattern.sub(_redact_group, text)
        limit = self.max_chars if max_chars is None else max_chars
        if limit is not None and len(text) > limit:
            text = text[:limit].rstrip() + "\n... (truncated)"
        return text

    def _cut_ends(self, text: str, overlap: int = 6) -> str:
        """A secret truncated by whoever cut the text: its head at the end, or its tail at the start."""
        for s in self.secrets:
            for k in range(min(len(s) - 1, len(text)), overlap - 1, -1):
                if text.endswith(s[:k]):
                    text = text[:-k] + REDACTED
                    break
            for k in range(min(len(s) - 1, len(text)), overlap - 1, -1):
                if text.startswith(s[-k:]):
                    text = REDACTED + text[k:]
                    break
        return text

    def scrub_tree(self, value: Any, max_chars: int | None = None) -> Any:
        """Every str inside dicts / lists / tuples scrubbed (keys kept)."""
        if isinstance(value, str):
            return self.scrub(value, max_chars)
        if isinstance(value, dict):
            return {k: self.scrub_tree(v, max_chars) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.scrub_tree(v, max_chars) for v in value)
        return value


def _opaque(value: str) -> bool:
    """Random-looking (a token), not a name: 16+ characters with letters and digits, and not a
    snake_case / MACRO_CASE identifier or a dotted attribute chain (what code near ``key =`` holds)."""
    if len(value) < 16 or not any(c.isdigit() for c in value) or not any(c.isalpha() for c in value):
        return False
    if re.fullmatch(r"[0-9a-fA-F]+", value):
        return True
    return not (re.fullmatch(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+|[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+", value)
                or re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+", value))


def _redact_group(m: re.Match[str]) -> str:
    if m.re is PATTERNS["value_after_keyword"] and not _opaque(m.group(m.lastindex or 0)):
        return m.group(0)
    if m.lastindex:
        g = m.lastindex
        start, end = m.span(g)
        return m.group(0)[:start - m.start()] + REDACTED + m.group(0)[end - m.start():]
    return REDACTED


_DEFAULT: tuple[float, Scrubber] | None = None
_LOCK = threading.Lock()
REFRESH_S = 60.0


def default_scrubber() -> Scrubber:
    """A scrubber of this process's environment, rebuilt every :data:`REFRESH_S` seconds (a token
    created after start-up, e.g. by ``ray.init``, is picked up)."""
    global _DEFAULT
    with _LOCK:
        now = time.monotonic()
        if _DEFAULT is None or now - _DEFAULT[0] > REFRESH_S:
            _DEFAULT = (now, Scrubber.from_environment())
        return _DEFAULT[1]


def scrub(text: Any, max_chars: int | None = None) -> Any:
    return default_scrubber().scrub(text, max_chars)
