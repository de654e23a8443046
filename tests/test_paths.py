"""Temporary siblings: the name a writer makes is the name a recovery finds."""

from __future__ import annotations

from depsi.io.paths import REPLACED, WRITING, temporary_sibling, temporary_siblings


def test_a_temporary_sibling_is_hidden_beside_its_product_and_found_by_its_tag(tmp_path):
    product = tmp_path / "stm.zarr"
    writing, replaced = temporary_sibling(product), temporary_sibling(product, REPLACED)
    assert writing.parent == tmp_path and writing.name.startswith(".stm.zarr.writing-")
    assert writing != temporary_sibling(product)  # random: two writers never collide
    writing.mkdir()
    replaced.mkdir()
    (tmp_path / ".other.zarr.writing-0badf00d").mkdir()
    assert temporary_siblings(product, WRITING) == [writing]
    assert temporary_siblings(product, REPLACED) == [replaced]


def test_keep_suffix_puts_the_suffix_last_and_finds_only_that_suffix(tmp_path):
    product = tmp_path / "velocity.tif"
    tmp = temporary_sibling(product, keep_suffix=True)
    assert tmp.suffix == ".tif" and tmp.name.startswith(".velocity.writing-")
    tmp.touch()
    (tmp_path / ".velocity.writing-0badf00d.png").touch()
    assert temporary_siblings(product, keep_suffix=True) == [tmp]


def test_glob_characters_in_a_product_name_are_taken_literally(tmp_path):
    product = tmp_path / "run[1].zarr"
    tmp = temporary_sibling(product)
    tmp.mkdir()
    (tmp_path / ".run1.zarr.writing-0badf00d").mkdir()
    assert temporary_siblings(product) == [tmp]
