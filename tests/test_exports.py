import awl


def test_public_names_are_pinned() -> None:
    """The public surface changes only on purpose."""
    assert sorted(awl.__all__) == awl.__all__
    for name in awl.__all__:
        assert hasattr(awl, name), name
