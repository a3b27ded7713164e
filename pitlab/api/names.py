"""The Kubernetes name grammars pitlab meets: the names the API server accepts for a resource, and the stricter
ones of the objects derived from it.

- DNS-1123 subdomain: what the API server accepts as the name of a custom resource (and a ConfigMap, a Job):
  at most 253 characters, lowercase letters, digits, ``-`` and ``.``, every dot-separated part starting and
  ending with a letter or digit.
- DNS-1123 label: at most 63 characters, lowercase letters, digits and ``-``, starting and ending with a
  letter or digit (a pod hostname, a label value pitlab writes).
- DNS-1035 label: a DNS-1123 label that starts with a letter (a Service name; the Kubeflow training operator
  requires it of a PyTorchJob's name).
"""

from __future__ import annotations

import re

SUBDOMAIN_MAX = 253
LABEL_MAX = 63
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(_LABEL)
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")

RESOURCE_NAME_RULE = ("a resource name has at most 253 characters, only lowercase letters a-z, digits 0-9, '-' "
                      "and '.', starts and ends with a letter or digit, and has a letter or digit on both sides "
                      "of every '.' (Kubernetes' rule for object names; e.g. 'qwen3.5-pit', '2016-fomc')")
LABEL_RULE = ("has at most 63 characters, only lowercase letters a-z, digits 0-9 and '-', and starts and ends "
              "with a letter or digit (e.g. 'leakage-2016')")


def is_label(name: str, dns1035: bool = False) -> bool:
    """Whether ``name`` is a DNS-1123 label (a DNS-1035 label when ``dns1035``)."""
    return len(name) <= LABEL_MAX and bool((DNS1035_LABEL if dns1035 else DNS1123_LABEL).fullmatch(name))


def is_subdomain(name: str) -> bool:
    """Whether ``name`` is a DNS-1123 subdomain (the API server's rule for a resource's ``metadata.name``)."""
    return len(name) <= SUBDOMAIN_MAX and bool(DNS1123_SUBDOMAIN.fullmatch(name))


def _problem(name: str, max_len: int, allowed: str) -> str:
    """What keeps ``name`` from the grammar of lowercase alphanumeric parts joined by ``allowed`` separators."""
    if not name:
        return "is empty"
    if len(name) > max_len:
        return f"has {len(name)} characters (at most {max_len})"
    for i, ch in enumerate(name, 1):
        if not (ch in allowed or ch.isascii() and (ch.isdigit() or ch.islower())):
            kind = "an uppercase letter" if ch.isupper() else "a character that is not allowed"
            return f"has {kind} {ch!r} at position {i}"
    if not name[0].isalnum():
        return f"starts with {name[0]!r}"
    if not name[-1].isalnum():
        return f"ends with {name[-1]!r}"
    bad = re.search(r"\.\.|\.-|-\.", name)
    assert bad is not None  # the only way left to fail the grammar
    return f"has {bad.group()!r} at position {bad.start() + 1}"


def resource_name_problem(name: str) -> str | None:
    """None when ``name`` is a valid resource name (DNS-1123 subdomain), else what is wrong with it, in words
    (``has an uppercase letter 'Q' at position 1``)."""
    return None if is_subdomain(name) else _problem(name, SUBDOMAIN_MAX, "-.")


def label_problem(name: str) -> str | None:
    """None when ``name`` is a DNS-1123 label, else what is wrong with it, in words."""
    return None if is_label(name) else _problem(name, LABEL_MAX, "-")
