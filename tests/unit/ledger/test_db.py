"""An outage and a refused row are told apart by the error the driver raises."""

from __future__ import annotations

import sqlite3

import asyncpg
import pytest
import sqlalchemy.exc

from gateway.ledger.db import refused_content


def wrapped(orig: BaseException, kind: type[sqlalchemy.exc.DBAPIError]) -> BaseException:
    return kind("INSERT ...", {}, orig)


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.CharacterNotInRepertoireError("invalid byte sequence for encoding"),
        asyncpg.StringDataRightTruncationError("value too long"),
        asyncpg.UntranslatableCharacterError("unsupported Unicode escape sequence"),
        asyncpg.NumericValueOutOfRangeError("out of range"),
        asyncpg.NotNullViolationError("null value"),
        asyncpg.CheckViolationError("check"),
        asyncpg.ForeignKeyViolationError("no such price"),
        OverflowError("value out of int64 range"),
        UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
        wrapped(
            sqlite3.IntegrityError("NOT NULL constraint failed"), sqlalchemy.exc.IntegrityError
        ),
        wrapped(sqlite3.DataError("string or blob too big"), sqlalchemy.exc.DataError),
        sqlite3.IntegrityError("CHECK constraint failed"),  # raw, from the writer's driver
        sqlite3.DataError("string or blob too big"),
    ],
)
def test_refused_for_content(exc: BaseException) -> None:
    assert refused_content(exc)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connection refused"),
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError(),
        asyncpg.TooManyConnectionsError("sorry, too many clients already"),
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        asyncpg.QueryCanceledError("canceling statement due to statement timeout"),
        asyncpg.ConnectionDoesNotExistError("connection was closed"),
        asyncpg.DiskFullError("could not extend file"),
        asyncpg.UndefinedColumnError("column does not exist"),  # a newer schema: wait
        wrapped(sqlite3.OperationalError("database is locked"), sqlalchemy.exc.OperationalError),
        sqlite3.OperationalError("database is locked"),
        sqlite3.OperationalError("disk I/O error"),
        TypeError("a bug"),
    ],
)
def test_an_outage_or_the_unexpected_is_no_refusal(exc: BaseException) -> None:
    assert not refused_content(exc)


def test_a_driver_error_wrapped_by_sqlalchemy_is_read_by_its_sqlstate() -> None:
    orig = asyncpg.CharacterNotInRepertoireError("invalid byte sequence")
    assert refused_content(wrapped(orig, sqlalchemy.exc.DBAPIError))
    assert not refused_content(
        wrapped(asyncpg.AdminShutdownError("bye"), sqlalchemy.exc.DBAPIError)
    )
