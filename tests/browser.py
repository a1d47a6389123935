"""Headless Chromium for the console's tests (Debian's chromium + chromium-driver through Selenium;
no browser download). Where Chromium is missing, the browser tests fail with one line saying how
to install it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import REPO

CHROMIUM = os.environ.get("HOSPITRUST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("HOSPITRUST_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("HOSPITRUST_TEST_ARTIFACTS", REPO / "test-artifacts"))
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,1000")


def missing_browser() -> str | None:
    chromium = shutil.which(CHROMIUM) or (CHROMIUM if Path(CHROMIUM).is_file() else None)
    driver = shutil.which(CHROMEDRIVER) or (CHROMEDRIVER if Path(CHROMEDRIVER).is_file() else None)
    if chromium and driver:
        try:
            import selenium  # noqa: F401
        except ImportError:
            return "the browser tests need Selenium: pip install -e '.[test]'"
        return None
    return ("no headless Chromium: install Debian's chromium and chromium-driver (sudo apt-get install chromium "
            "chromium-driver), or point HOSPITRUST_CHROMIUM / HOSPITRUST_CHROMEDRIVER at them; or run -m 'not browser'")


@pytest.fixture
def browser():
    """A headless Chromium driven by Selenium; quits after the test."""
    problem = missing_browser()
    if problem:
        pytest.fail(problem, pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in FLAGS:
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, condition, timeout: float = 30.0, what: str = "the page"):
    """Poll ``condition(driver)`` until it is truthy; its value, or a failure naming ``what``."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def check(d):
        try:
            return condition(d)
        except WebDriverException:
            return False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(check)
    except Exception:
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n{driver.find_element('id', 'app').text[:2000]}")
