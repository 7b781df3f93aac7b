import pytest

from gateway.errors import ModelNotFound
from gateway.flow import ANONYMOUS, Principal
from gateway.stages.auth import authorize_model


def test_a_key_limited_to_models_gets_404_for_others() -> None:
    p = Principal(key_id="key_1", team="eng", models=frozenset({"a"}))
    authorize_model(p, "a")
    with pytest.raises(ModelNotFound) as info:
        authorize_model(p, "b")
    assert info.value.status == 404
    assert info.value.code == "model_not_found"


def test_keys_without_a_list_and_anonymous_callers_may_call_any_model() -> None:
    authorize_model(Principal(key_id="key_1", team="eng"), "b")
    authorize_model(ANONYMOUS, "b")
