"""Secret keys (where they come from, what a bad one says), the SecretBox and token helpers."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from levers9.state.crypto import ENV_KEY, SecretBox, hash_token, load_keys, new_token
from levers9.state.errors import DecryptionError, SecretKeyError


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_KEY, raising=False)


def test_env_keys_win_over_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second, in_file = Fernet.generate_key(), Fernet.generate_key(), Fernet.generate_key()
    key_file = tmp_path / "keys"
    key_file.write_bytes(in_file + b"\n")
    monkeypatch.setenv(ENV_KEY, f" {first.decode()} ,{second.decode()},")
    assert load_keys(str(key_file), str(tmp_path / "data")) == [first, second]
    assert not (tmp_path / "data").exists()


def test_an_empty_env_var_counts_as_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = Fernet.generate_key()
    (tmp_path / "keys").write_bytes(key)
    monkeypatch.setenv(ENV_KEY, "  ")
    assert load_keys(str(tmp_path / "keys"), str(tmp_path)) == [key]


def test_a_malformed_env_key_names_the_variable_and_not_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_KEY, f"{Fernet.generate_key().decode()},not-a-real-key-hunter2")
    with pytest.raises(SecretKeyError) as caught:
        load_keys(None, str(tmp_path))
    message = str(caught.value)
    assert f"key 2 of {ENV_KEY}" in message
    assert "Fernet.generate_key()" in message
    assert "32 url-safe base64" in message
    assert "hunter2" not in message


def test_key_file_with_comments_and_several_keys(tmp_path: Path) -> None:
    new, old = Fernet.generate_key(), Fernet.generate_key()
    key_file = tmp_path / "keys"
    key_file.write_text(f"# rotated on Monday\n\n{new.decode()}\n  # the old one, until re-encrypted\n{old.decode()}\n")
    assert load_keys(str(key_file), str(tmp_path)) == [new, old]


def test_a_malformed_key_file_line_names_the_file_and_line(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(f"# comment\n{Fernet.generate_key().decode()}\nshort\n")
    with pytest.raises(SecretKeyError, match=rf"line 3 of secret key file {key_file}.*Fernet.generate_key\(\)"):
        load_keys(str(key_file), str(tmp_path))


def test_a_key_file_without_keys_is_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# nothing yet\n\n")
    with pytest.raises(SecretKeyError, match="holds no key"):
        load_keys(str(key_file), str(tmp_path))


def test_a_configured_key_file_that_is_missing_is_an_error_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "keys"
    with pytest.raises(SecretKeyError, match=rf"{missing} \(state.secret_key_file\) does not exist"):
        load_keys(str(missing), str(tmp_path))
    assert not missing.exists()


def test_the_default_key_file_is_created_private_and_reused(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh" / "data"
    keys = load_keys(None, str(data_dir))
    key_file = data_dir / "secret.key"
    assert len(keys) == 1
    Fernet(keys[0])  # a usable key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert load_keys(None, str(data_dir)) == keys
    assert [p.name for p in data_dir.iterdir()] == ["secret.key"]  # no temporary file left behind


def test_box_round_trip_and_key_rotation() -> None:
    old, new = Fernet.generate_key(), Fernet.generate_key()
    written_with_old = SecretBox([old]).encrypt(b"value")
    rotated_box = SecretBox([new, old])
    assert rotated_box.decrypt(written_with_old) == b"value"
    fresh = rotated_box.encrypt(b"fresh")
    assert SecretBox([new]).decrypt(fresh) == b"fresh"
    with pytest.raises(DecryptionError):
        SecretBox([old]).decrypt(fresh)  # the first key is the one that encrypts
    re_encrypted = rotated_box.rotate(written_with_old)
    assert SecretBox([new]).decrypt(re_encrypted) == b"value"


def test_a_wrong_key_says_so_without_the_ciphertext() -> None:
    ciphertext = SecretBox([Fernet.generate_key()]).encrypt(b"secret")
    with pytest.raises(DecryptionError) as caught:
        SecretBox([Fernet.generate_key()]).decrypt(ciphertext)
    message = str(caught.value)
    assert "does not match" in message
    assert "keep the old key listed after the new one" in message
    assert ciphertext.decode() not in message
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


def test_sealed_values_are_bound_to_their_place() -> None:
    box = SecretBox([Fernet.generate_key()])
    sealed = box.seal("s3cr3t", context="secret:ws_a/API_KEY")
    assert box.unseal(sealed, context="secret:ws_a/API_KEY") == "s3cr3t"
    with pytest.raises(DecryptionError, match="encrypted for another record"):
        box.unseal(sealed, context="secret:ws_b/API_KEY")


def test_the_box_does_not_show_its_keys() -> None:
    key = Fernet.generate_key()
    box = SecretBox([key, Fernet.generate_key()])
    assert repr(box) == "SecretBox(2 keys)"
    assert key.decode() not in repr(box)
    with pytest.raises(SecretKeyError, match="no secret key"):
        SecretBox([])


def test_tokens_name_their_kind_and_are_random() -> None:
    token = new_token("worker")
    assert token.startswith("l9_worker_")
    assert len(token) >= len("l9_worker_") + 43  # 32 random bytes, base64
    assert new_token("worker") != token
    with pytest.raises(ValueError, match="token kind 'Bad Kind'"):
        new_token("Bad Kind")


def test_token_hash_is_sha256_hex() -> None:
    assert hash_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    token = new_token("user")
    assert hash_token(token) == hashlib.sha256(token.encode()).hexdigest()
